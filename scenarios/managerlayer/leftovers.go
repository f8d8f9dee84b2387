package managerlayer

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/vmchaos/vmchaos/injector"
)

// ownerFile names the runner that owns a run's temp dir: the next run
// kills what a SIGKILLed runner left behind (its VMMs outlive it by design).
const ownerFile = "owner.json"

func writeOwner(tmp string) error {
	p, err := injector.Identify(os.Getpid())
	if err != nil {
		return err
	}
	b, _ := json.Marshal(p)
	return os.WriteFile(filepath.Join(tmp, ownerFile), b, 0o644)
}

// ownerAlive reads a run dir's owner; a dir without a readable owner counts
// as owned only while it is being created (no tagged process can exist yet).
func ownerAlive(runDir string) bool {
	b, err := os.ReadFile(filepath.Join(runDir, ownerFile))
	if err != nil {
		return false
	}
	var p injector.Proc
	if json.Unmarshal(b, &p) != nil {
		return false
	}
	return p.Alive()
}

// cleanLeftovers kills the processes of manager-layer runs whose runner is
// gone (found by the case tag every one of them inherits) and removes those
// runs' temp dirs. It returns what it killed, for the progress log.
func cleanLeftovers() ([]string, error) {
	var killed []string
	var errs []string
	dead := map[string]bool{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := fmt.Sscanf(e.Name(), "%d", new(int)); err != nil {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil {
			continue
		}
		for _, kv := range strings.Split(string(env), "\x00") {
			caseDir, ok := strings.CutPrefix(kv, EnvCaseTag+"=")
			if !ok {
				continue
			}
			runDir := filepath.Dir(caseDir)
			if ownerAlive(runDir) {
				break
			}
			var pid int
			fmt.Sscanf(e.Name(), "%d", &pid)
			if !alive(pid) {
				break
			}
			if _, err := killPID(pid); err != nil {
				errs = append(errs, err.Error())
			} else {
				killed = append(killed, fmt.Sprintf("%d %v", pid, argvOf(pid)))
			}
			dead[runDir] = true
			break
		}
	}
	for d := range dead {
		if strings.HasPrefix(filepath.Base(d), "vmchaos-mgr-") {
			_ = os.RemoveAll(d)
		}
	}
	if len(errs) > 0 {
		return killed, fmt.Errorf("leftovers of a killed run: %s", strings.Join(errs, "; "))
	}
	return killed, nil
}
