package main

import (
	"bufio"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/ledger/writerproto"
	"github.com/vmchaos/vmchaos/stackbin"
)

// The writer is tested as the binary the image installs: $VMCHAOS_BIN's
// (make build), else one built here the same way (CGO_ENABLED=0).
var (
	binOnce sync.Once
	binPath string
	binErr  error
	binTmp  string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binTmp != "" {
		os.RemoveAll(binTmp)
	}
	os.Exit(code)
}

func writerBin(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		if d := os.Getenv(stackbin.Env); d != "" {
			binPath = filepath.Join(d, writerproto.Cmd)
			if _, binErr = os.Stat(binPath); binErr != nil {
				binErr = fmt.Errorf("%s=%s has no %s (run `make build`): %w", stackbin.Env, d, writerproto.Cmd, binErr)
			}
			return
		}
		if binTmp, binErr = os.MkdirTemp("", "vmchaos-writer-test-"); binErr != nil {
			return
		}
		binPath = filepath.Join(binTmp, writerproto.Cmd)
		cmd := exec.Command("go", "build", "-o", binPath, ".")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// proc is one writer process: its lines arrive on lines (closed at stdout
// EOF), its stdin is held open until closeStdin.
type proc struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout io.ReadCloser
	lines  chan string
	stderr strings.Builder
	waited chan struct{}
	status int
	// what collect parsed so far
	first int
	boot  string
	acks  []int
}

func startWriter(t *testing.T, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(writerBin(t), args...), lines: make(chan string, 1<<16), waited: make(chan struct{})}
	var err error
	if p.stdin, err = p.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if p.stdout, err = p.cmd.StdoutPipe(); err != nil {
		t.Fatal(err)
	}
	p.cmd.Stderr = &p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// the reader drains stdout before Wait closes it
	read := make(chan struct{})
	go func() {
		defer close(read)
		defer close(p.lines)
		sc := bufio.NewScanner(p.stdout)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
	}()
	go func() {
		<-read
		_ = p.cmd.Wait()
		p.status = p.cmd.ProcessState.ExitCode()
		if ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			p.status = 128 + int(ws.Signal())
		}
		close(p.waited)
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill() // by its recorded pid; a no-op once it exited
		<-p.waited
	})
	return p
}

// wait returns the exit status; the test fails if the writer does not end.
func (p *proc) wait(t *testing.T) int {
	t.Helper()
	select {
	case <-p.waited:
		return p.status
	case <-time.After(30 * time.Second):
		t.Fatalf("writer did not exit (stderr %q)", p.stderr.String())
		return -1
	}
}

// collect parses the writer's output with the ledger's parser (the start
// line, then acks in sequence) until it holds n acks (n < 0: until EOF).
func (p *proc) collect(t *testing.T, n int) (first int, boot string, acks []int) {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for n < 0 || len(p.acks) < n {
		select {
		case l, ok := <-p.lines:
			if !ok {
				if p.first == 0 {
					t.Fatalf("no start line (stderr %q)", p.stderr.String())
				}
				return p.first, p.boot, p.acks
			}
			if p.first == 0 {
				var err error
				if p.first, p.boot, err = writerproto.ParseStart(l); err != nil {
					t.Fatal(err)
				}
				continue
			}
			seq, begin, ack, err := writerproto.ParseAck(l)
			if err != nil {
				t.Fatal(err)
			}
			if begin <= 0 || ack < begin {
				t.Fatalf("ack %q: begin/ack out of order", l)
			}
			if want := p.first + len(p.acks); seq != want {
				t.Fatalf("ack %q: seq %d, want %d (acks in sequence, no gaps)", l, seq, want)
			}
			p.acks = append(p.acks, seq)
		case <-timeout:
			t.Fatalf("%d of %d acks in 30s (stderr %q)", len(p.acks), n, p.stderr.String())
		}
	}
	return p.first, p.boot, p.acks
}

func dirs(t *testing.T) (disk, ram string) {
	d := t.TempDir()
	return filepath.Join(d, "var/lib/vmchaos/workload"), filepath.Join(d, "run/vmchaos-workload")
}

// mustHaveMarkers: every acked seq has its disk and its RAM file.
func mustHaveMarkers(t *testing.T, disk, ram string, acks []int) {
	t.Helper()
	for _, s := range acks {
		for _, d := range []string{disk, ram} {
			if _, err := os.Stat(filepath.Join(d, writerproto.Marker(s))); err != nil {
				t.Fatalf("acked seq %d: %v", s, err)
			}
		}
	}
}

func TestWriterAcksOnlyMarkersOnDiskAndInRAM(t *testing.T) {
	disk, ram := dirs(t)
	p := startWriter(t, "--rate", "2000", "--count", "50", "--start", "7", "--dir", disk, "--ram-dir", ram)
	first, boot, acks := p.collect(t, -1)
	if st := p.wait(t); st != 0 {
		t.Fatalf("exit %d, stderr %q", st, p.stderr.String())
	}
	want, _ := os.ReadFile(bootIDPath)
	if first != 7 || len(acks) != 50 || boot != strings.TrimSpace(string(want)) {
		t.Fatalf("start %d boot %q, %d acks; want start 7, boot %q, 50 acks", first, boot, len(acks), want)
	}
	mustHaveMarkers(t, disk, ram, acks)
	if ents, _ := os.ReadDir(disk); len(ents) != 50 {
		t.Fatalf("%d disk markers, want 50 (--count stops the writer)", len(ents))
	}
}

func TestWriterStartAutoContinuesAfterTheHighestMarker(t *testing.T) {
	disk, ram := dirs(t)
	p := startWriter(t, "--rate", "5000", "--count", "10", "--dir", disk, "--ram-dir", ram)
	if first, _, acks := p.collect(t, -1); first != 1 || len(acks) != 10 || p.wait(t) != 0 {
		t.Fatalf("first session: start %d, %d acks, stderr %q", first, len(acks), p.stderr.String())
	}
	// a marker beyond the first session's (on disk only) moves the start
	if err := createFile(filepath.Join(disk, writerproto.Marker(40)), false); err != nil {
		t.Fatal(err)
	}
	p = startWriter(t, "--rate", "5000", "--count", "3", "--start", "auto", "--dir", disk, "--ram-dir", ram)
	first, _, acks := p.collect(t, -1)
	if first != 41 || len(acks) != 3 || p.wait(t) != 0 {
		t.Fatalf("second session: start %d with %d acks, want 41 with 3 (stderr %q)", first, len(acks), p.stderr.String())
	}
	mustHaveMarkers(t, disk, ram, acks)
}

// The SSH session ending reaches the writer as stdin EOF, SIGHUP or a
// closed stdout; each ends it with the status the fake guest's writer gives.
func TestWriterEndsWithItsSession(t *testing.T) {
	for _, c := range []struct {
		name string
		end  func(p *proc)
		want int
	}{
		{"stdin EOF", func(p *proc) { p.stdin.Close() }, 0},
		{"SIGHUP", func(p *proc) { _ = p.cmd.Process.Signal(syscall.SIGHUP) }, 0},
		{"stdout closed", func(p *proc) { p.stdout.Close() }, 141},
	} {
		t.Run(c.name, func(t *testing.T) {
			disk, ram := dirs(t)
			p := startWriter(t, "--rate", "500", "--dir", disk, "--ram-dir", ram)
			p.collect(t, 5)
			c.end(p)
			if st := p.wait(t); st != c.want {
				t.Fatalf("exit %d, want %d (stderr %q)", st, c.want, p.stderr.String())
			}
		})
	}
}

// A writer killed at any point has acked only markers that are on disk and
// in RAM: the acks are a prefix of what is durable.
func TestWriterKilledLeavesNoAckWithoutItsMarkers(t *testing.T) {
	for i, after := range []int{1, 37, 300} {
		disk, ram := dirs(t)
		p := startWriter(t, "--rate", "20000", "--group-ms", "0", "--dir", disk, "--ram-dir", ram)
		p.collect(t, after)
		if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_, _, acks := p.collect(t, -1)
		if st := p.wait(t); st != 128+int(syscall.SIGKILL) {
			t.Fatalf("run %d: exit %d, want killed", i, st)
		}
		if len(acks) < after {
			t.Fatalf("run %d: %d acks", i, len(acks))
		}
		mustHaveMarkers(t, disk, ram, acks)
	}
}

func TestWriterRejectsBadArgumentsWithStatus2(t *testing.T) {
	disk, _ := dirs(t)
	for _, c := range []struct{ args, says string }{
		{"--rate 0", "--rate"},
		{"--rate fast", "--rate"},
		{"--start 0", "--start"},
		{"--count -3", "--count"},
		{"--verbose 1", "unknown option --verbose"},
		{"--count", "needs a value"},
		{"--dir " + disk + " --ram-dir " + disk, "need a dir each"},
	} {
		p := startWriter(t, strings.Fields(c.args)...)
		for l := range p.lines {
			t.Errorf("%q: wrote %q", c.args, l)
		}
		st := p.wait(t)
		if msg := p.stderr.String(); st != 2 || !strings.Contains(msg, c.says) || !strings.Contains(msg, "usage: ") {
			t.Errorf("%q: exit %d, stderr %q; want 2 and an error saying %q", c.args, st, msg, c.says)
		}
	}
	if _, err := os.Stat(disk); err == nil {
		t.Fatal("a rejected writer created its disk dir")
	}
}

// The image installs the binary into a Debian guest: it must not need the
// host's libc.
func TestWriterBinaryIsStatic(t *testing.T) {
	f, err := elf.Open(writerBin(t))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Fatal("the writer binary has an ELF interpreter (dynamically linked): build it with CGO_ENABLED=0")
		}
	}
}
