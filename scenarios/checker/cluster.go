package checker

import (
	"context"
	"net/http"
)

// Invariants of the cluster cases (op:migrate), judged by the runner's
// migrate step (runner/cluster.go) while the migration is in flight.
const (
	// ClusterOneLiveVM: at no time do two nodes of the cluster both hold a
	// VM of one name (a target that started before its source released
	// the VM, a source that kept running after it released it).
	ClusterOneLiveVM = "cluster-one-live-vm"
	// MigrateSourceDurable: a migration's source gives the VM up only once
	// its snapshot is durable in the registry (<name>:hibernate committed,
	// every blob served) and no VM of the name is left on it.
	MigrateSourceDurable = "migrate-source-durable"
	// NoFreshBootOverHibernate: a migration's target brings the VM back by
	// a wake from the :hibernate snapshot its source pushed, never by a
	// fresh boot of the image.
	NoFreshBootOverHibernate = "no-fresh-boot-over-hibernate"
)

// ReadRegistrySnapshotOnce is ReadRegistrySnapshot for a single read: every
// blob's content is hashed.
func ReadRegistrySnapshotOnce(ctx context.Context, cl *http.Client, base, name string) (*RegistrySnapshot, error) {
	return ReadRegistrySnapshot(ctx, cl, base, name, &digestCache{ok: map[string]string{}})
}
