package runner

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"

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

// cleanMgrLeftovers kills the processes of manager runs whose runner is
// gone (found by the case tag every one of them inherits) and removes those
// runs' temp dirs. It returns what it killed, for the progress log.
func cleanMgrLeftovers() ([]string, error) {
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

// argvOf is pid's command line (nil when gone).
func argvOf(pid int) []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return nil
	}
	return strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
}

// alive reports whether pid is a live, non-zombie process.
func alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	st, err := injector.ReadStat(pid)
	return err == nil && st.State != 'Z'
}

// killPID SIGKILLs a process of a manager case through a pidfd (identified
// by pid and start time, so a reused pid is never hit) and waits until it is
// gone (the one reaper collects a VMM orphaned to the runner). It returns
// the CLOCK_MONOTONIC time right after the signal was sent.
func killPID(pid int) (int64, error) {
	p, err := injector.Identify(pid)
	if err != nil {
		return 0, fmt.Errorf("identify %d: %w", pid, err)
	}
	fd, err := injector.OpenPidFD(p)
	if err != nil {
		return 0, fmt.Errorf("pidfd %d: %w", pid, err)
	}
	defer fd.Close()
	if err := fd.Signal(syscall.SIGKILL); err != nil {
		return 0, fmt.Errorf("kill %d: %w", pid, err)
	}
	sent := failpoint.Now()
	deadline := time.Now().Add(10 * time.Second)
	for alive(pid) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if alive(pid) {
		return sent, fmt.Errorf("pid %d still alive 10s after SIGKILL", pid)
	}
	return sent, nil
}
