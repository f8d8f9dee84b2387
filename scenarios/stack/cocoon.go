package stack

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/vmchaos/vmchaos/manager"
	"github.com/vmchaos/vmchaos/manager/cocoon"
)

// CocoonOptions puts a real cocoon under the case's agent (issue 33 item 3):
// the agent runs as `--manager cocoon --manager-bin Bin`, over a cocoon
// store set up the way the manager-level runner sets one up (the adapter's
// Setup, fakech as cloud-hypervisor, Image imported as the guest).
type CocoonOptions struct {
	Bin   string // the cocoon binary under test (--manager-bin)
	Image string // the fake guest disk (raw), imported by Setup ("": the run's, with its key authorized)
}

// CocoonBaseVM is the VM the base snapshot is saved from (removed after).
const CocoonBaseVM = "base-src"

// setupCocoon makes the case's cocoon store and its base snapshot "base",
// saved from a `vm run --nics 0` VM (cocoon has no snapshot import of a
// vmctl export), in place of vmctl's import of the run's base.
func (s *Stack) setupCocoon(ctx context.Context) error {
	o := s.opts.Cocoon
	if s.run.Real != nil {
		return fmt.Errorf("stack: an agent over cocoon runs on the fake backend only (fakech installed as cloud-hypervisor)")
	}
	if why, _ := CocoonNetPreflight(); why != "" {
		return fmt.Errorf("stack: cocoon networking: %s", why)
	}
	image := o.Image
	if image == "" {
		var err error
		if image, err = s.run.cocoonImage(); err != nil {
			return err
		}
	}
	var err error
	if s.cocoonNet, err = s.startCocoonNet(ctx, o.Bin); err != nil {
		return err
	}
	s.Cocoon = cocoon.New(manager.Options{Bin: s.cocoonNet.wrapper, Dir: filepath.Join(s.Dir, "cocoon"), VMMDir: s.run.BinDir, Image: image})
	if err := s.Cocoon.Setup(ctx); err != nil {
		return fmt.Errorf("stack: cocoon store: %w", err)
	}
	if err := s.writeCNIConf(); err != nil {
		return err
	}
	one := 1
	for _, c := range []manager.Call{
		// one NIC: every clone of base inherits it (the agent clones
		// with --nics 0, cocoon's "as the snapshot")
		{Verb: manager.VerbCreate, Name: CocoonBaseVM, NICs: &one},
		{Verb: manager.VerbSnapshotSave, VM: CocoonBaseVM, Name: "base"},
		{Verb: manager.VerbRm, VM: CocoonBaseVM},
	} {
		if _, err := s.CocoonVerb(ctx, c); err != nil {
			return fmt.Errorf("stack: cocoon base snapshot: %w", err)
		}
	}
	return nil
}

// CocoonVerb runs one cocoon verb with the harness environment (no trace,
// no failpoints).
func (s *Stack) CocoonVerb(ctx context.Context, c manager.Call) ([]byte, error) {
	argv, err := s.Cocoon.Command(c)
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = s.baseEnv()
	cmd.Dir = s.Dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, strings.TrimSpace(string(out)))
	}
	return out, nil
}

// managerArgs is how the agent reaches its manager: vmctl (bundled) or the
// cocoon under test, run inside the case's network and mount namespace (the
// wrapper); `--nics 0` is cocoon's "the snapshot's NICs" on a clone.
func (s *Stack) managerArgs() []string {
	if s.opts.Cocoon != nil {
		return []string{"--manager", "cocoon", "--manager-bin", s.cocoonNet.wrapper, "--nics", "0"}
	}
	return []string{"--vmctl", filepath.Join(s.run.BinDir, "vmctl")}
}
