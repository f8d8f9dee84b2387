package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/injector"
)

// TestDoctorFindsAndCleansAPlantedLeftover plants what a SIGKILLed runner
// leaves: a run record whose runner is dead and a live process carrying the
// run's tag. doctor must list it (exit 1), and --clean must kill it.
func TestDoctorFindsAndCleansAPlantedLeftover(t *testing.T) {
	reg := t.TempDir()
	t.Setenv(injector.EnvRegistryIndex, t.TempDir()) // doctor reads only reg and this empty index
	runner := exec.Command("/bin/true")
	if err := runner.Start(); err != nil {
		t.Fatal(err)
	}
	rp, err := injector.Identify(runner.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	_ = runner.Wait() // the runner is gone
	left := exec.Command("/bin/sleep", "600")
	left.Env = append(os.Environ(), injector.EnvRunTag+"=planted-run")
	if err := left.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = left.Process.Kill(); _ = left.Wait() })
	rec := injector.Record{RunID: "planted-run", Kind: injector.KindBuiltin, StateDir: t.TempDir(), Runner: rp, Created: time.Now()}
	b, _ := json.Marshal(rec)
	if err := os.WriteFile(filepath.Join(reg, "planted-run.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}

	run := func(args ...string) (string, error) {
		c := newDoctorCmd()
		var out bytes.Buffer
		c.SetOut(&out)
		c.SetErr(&out)
		c.SetArgs(append(args, "--registry", reg))
		err := c.Execute()
		return out.String(), err
	}
	census := func() injector.Census {
		t.Helper()
		out, err := run("--census", "--json", "--run", "planted-run")
		var c injector.Census
		// cobra appends the exit error (and usage) after the JSON
		if jerr := json.NewDecoder(strings.NewReader(out)).Decode(&c); jerr != nil {
			t.Fatalf("doctor --census --json: %v (%v)\n%s", jerr, err, out)
		}
		var cl censusLeaks
		if (c.Leaks() > 0) != errors.As(err, &cl) {
			t.Fatalf("doctor --census: exit error %v with %d leaks", err, c.Leaks())
		}
		return c
	}
	if c := census(); c.Procs != 1 {
		t.Fatalf("census of the planted run: %d processes, want 1\n%s", c.Procs, c.Table())
	}
	out, err := run()
	var lf leftoversFound
	if !errors.As(err, &lf) || lf.ExitCode() != 1 {
		t.Fatalf("doctor: err %v, want leftovers (exit 1)\n%s", err, out)
	}
	if !strings.Contains(out, "found: run planted-run") || !strings.Contains(out, strconv.Itoa(left.Process.Pid)) {
		t.Fatalf("doctor did not list the planted leftover:\n%s", out)
	}
	for _, want := range []string{"root", "cgroup2", "systemd", "kvm", "ch", "fuse"} {
		if !strings.Contains(out, "\n"+want+" ") {
			t.Fatalf("doctor output lacks the %s check:\n%s", want, out)
		}
	}
	out, err = run("--clean")
	if err != nil || !strings.Contains(out, "cleaned: run planted-run") {
		t.Fatalf("doctor --clean: %v\n%s", err, out)
	}
	done := make(chan error, 1)
	go func() { done <- left.Wait() }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the planted leftover survived doctor --clean")
	}
	if c := census(); c.Leaks() != 0 {
		t.Fatalf("census of the planted run after --clean:\n%s", c.Table())
	}
	if out, err := run(); err != nil || !strings.Contains(out, "none") {
		t.Fatalf("after clean: %v\n%s", err, out)
	}
}
