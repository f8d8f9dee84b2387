package vmctl

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vmchaos/vmchaos/chapi"
	"github.com/vmchaos/vmchaos/timescale"
	"github.com/vmchaos/vmchaos/vmctl/api"
)

// ErrEjectPending marks a vm net that timed out waiting for the guest to
// ack an eject. The VM record keeps the ids (VM.Ejecting), so re-running the
// verb waits for the same devices.
var ErrEjectPending = errors.New(api.EjectPending)

// ejectBudget is how long vm net waits for the guest to ack an eject. A
// Linux guest acks a PCI hot-unplug within about a second.
func ejectBudget() time.Duration { return timescale.D(10 * time.Second) }

// nicID names a NIC after its MAC. CH checks a new id against its device
// tree, which keeps an unplugged device until the guest acks the eject and
// which a restore brings back from the snapshot, so a fixed "net0" collides
// after a restore or during a pending eject; a MAC-derived id only collides
// when the very same NIC comes back (a wake), which uniqueNICs resolves.
func nicID(mac string) string { return "n" + strings.ReplaceAll(mac, ":", "") }

// uniqueNICs gives each NIC an id the VMM's device tree does not hold,
// keeping the MAC-derived id when it is free. Taken ids belong to nodes a
// restore brought back with no device behind them: CH refuses to remove
// them ("Missing PCI device"), so the only way past them is another id.
func uniqueNICs(tree map[string]chapi.DeviceNode, nics []NIC) []NIC {
	out := slices.Clone(nics)
	used := map[string]bool{}
	for i := range out {
		base := out[i].ID
		if base == "" {
			base = nicID(out[i].MAC)
		}
		id := base
		for k := 1; tree[id].ID != "" || used[id]; k++ {
			id = base + "-" + strconv.Itoa(k)
		}
		out[i].ID = id
		used[id] = true
	}
	return out
}

// waitEjected polls the VMM until none of ids is in its device tree. It
// fails with ErrEjectPending after the budget. A Paused VMM is reported
// rather than waited on: no eject completes while paused.
func waitEjected(ctx context.Context, c *chapi.Client, ids []string, budget time.Duration) error {
	if len(ids) == 0 {
		return nil
	}
	deadline := time.Now().Add(budget)
	poll := min(max(budget/50, time.Millisecond), 100*time.Millisecond)
	for {
		info, err := c.Info(ctx)
		if err != nil {
			return fmt.Errorf("wait for eject: %w", err)
		}
		var left []string
		for _, id := range ids {
			if _, ok := info.DeviceTree[id]; ok {
				left = append(left, id)
			}
		}
		if len(left) == 0 {
			return nil
		}
		if info.State == chapi.StatePaused || !time.Now().Before(deadline) {
			what := fmt.Sprintf(MsgEjectPending, strings.Join(left, ","), budget)
			if info.State == chapi.StatePaused {
				what += " (the VMM is Paused: no eject completes while paused)"
			}
			return fmt.Errorf("%w: %s", ErrEjectPending, strings.TrimPrefix(what, api.EjectPending+": "))
		}
		if err := timescale.SleepRaw(ctx, poll); err != nil {
			return err
		}
	}
}
