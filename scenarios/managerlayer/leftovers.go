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

// owner is the runner of a run dir: its pid means something only in its
// own pid namespace.
type owner struct {
	injector.Proc
	PidNS string `json:"pid_ns"`
}

func pidNS() string {
	ns, _ := os.Readlink("/proc/self/ns/pid")
	return ns
}

func writeOwner(tmp string) error {
	p, err := injector.Identify(os.Getpid())
	if err != nil {
		return err
	}
	b, _ := json.Marshal(owner{Proc: p, PidNS: pidNS()})
	return os.WriteFile(filepath.Join(tmp, ownerFile), b, 0o644)
}

// ownerAlive reads a run dir's owner. A dir without a readable owner is
// dead (tagged processes exist only after the owner was written); an owner
// in another pid namespace (a run inside `vmchaos sandbox`) is never
// judged from here.
func ownerAlive(runDir string) bool {
	b, err := os.ReadFile(filepath.Join(runDir, ownerFile))
	if err != nil {
		return false
	}
	var o owner
	if json.Unmarshal(b, &o) != nil {
		return false
	}
	if o.PidNS != pidNS() {
		return true
	}
	return o.Alive()
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
