package ledger

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/ledger/writerproto"
	"github.com/vmchaos/vmchaos/stackbin"
	"golang.org/x/crypto/ssh"
)

// writerHost is an SSH server on loopback that runs the real
// vmchaos-writer binary for an exec of it, as a real guest's sshd does
// (stdin, stdout and stderr on the session), with its marker dirs moved into
// the test's temp dirs. Every writer it started is waited for at cleanup.
type writerHost struct {
	addr      string
	disk, ram string
	mu        sync.Mutex
	status    []int      // exit status of each writer that ended
	open      []net.Conn // client connections: closed at cleanup
	procs     sync.WaitGroup
	missing   bool // a guest without the writer: exec answers 127
}

// realWriterLedger is a ledger and a writer host that trusts its key.
func realWriterLedger(t *testing.T, missing bool) (*Ledger, *writerHost) {
	t.Helper()
	dir := t.TempDir()
	key, err := NewKey(filepath.Join(dir, "ssh"))
	if err != nil {
		t.Fatal(err)
	}
	l, err := Open(filepath.Join(dir, "ledger.jsonl"), key, filepath.Join(dir, "pins"))
	if err != nil {
		t.Fatal(err)
	}
	return l, startWriterHost(t, key, missing)
}

func startWriterHost(t *testing.T, key *Key, missing bool) *writerHost {
	t.Helper()
	bin, err := stackbin.Path(writerproto.Cmd)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%v (run `make build`)", err)
	}
	_, hk, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	hostKey, err := ssh.NewSignerFromKey(hk)
	if err != nil {
		t.Fatal(err)
	}
	want := key.Signer().PublicKey().Marshal()
	cfg := &ssh.ServerConfig{PublicKeyCallback: func(_ ssh.ConnMetadata, k ssh.PublicKey) (*ssh.Permissions, error) {
		if !bytes.Equal(k.Marshal(), want) {
			return nil, io.EOF
		}
		return nil, nil
	}}
	cfg.AddHostKey(hostKey)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	h := &writerHost{addr: ln.Addr().String(), disk: filepath.Join(dir, "disk"), ram: filepath.Join(dir, "run"), missing: missing}
	var conns sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		// A test that failed before its workload's Stop leaves the session
		// up, and the writer writes on: closing the connections ends both
		// (the writer stops on stdin EOF) instead of waiting for ever.
		h.mu.Lock()
		for _, c := range h.open {
			c.Close()
		}
		h.mu.Unlock()
		conns.Wait()
		h.procs.Wait()
	})
	conns.Add(1)
	go func() {
		defer conns.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			h.mu.Lock()
			h.open = append(h.open, c)
			h.mu.Unlock()
			conns.Add(1)
			go func() {
				defer conns.Done()
				h.serve(t, c, cfg, bin)
			}()
		}
	}()
	return h
}

func (h *writerHost) serve(t *testing.T, c net.Conn, cfg *ssh.ServerConfig, bin string) {
	defer c.Close()
	_, chans, reqs, err := ssh.NewServerConn(c, cfg)
	if err != nil {
		return
	}
	go ssh.DiscardRequests(reqs)
	for nc := range chans {
		ch, creqs, err := nc.Accept()
		if err != nil {
			return
		}
		for r := range creqs {
			if r.Type != "exec" || len(r.Payload) < 4 {
				_ = r.Reply(false, nil)
				continue
			}
			argv := strings.Fields(string(r.Payload[4:]))
			if len(argv) == 0 || argv[0] != writerproto.Cmd || h.missing {
				_ = r.Reply(true, nil)
				_, _ = io.WriteString(ch.Stderr(), "sh: 1: "+argv[0]+": not found\n")
				exit(ch, 127)
				break
			}
			cmd := exec.Command(bin, append(argv[1:], "--dir", h.disk, "--ram-dir", h.ram)...)
			cmd.Stdout, cmd.Stderr = ch, ch.Stderr()
			in, err := cmd.StdinPipe()
			if err == nil {
				err = cmd.Start()
			}
			if err != nil {
				t.Errorf("start the writer: %v", err)
				_ = r.Reply(false, nil)
				break
			}
			_ = r.Reply(true, nil)
			// the session's stdin reaches the writer until the session ends
			go func() { _, _ = io.Copy(in, ch); in.Close() }()
			h.procs.Add(1)
			go func() {
				defer h.procs.Done()
				_ = cmd.Wait()
				h.mu.Lock()
				h.status = append(h.status, cmd.ProcessState.ExitCode())
				h.mu.Unlock()
				exit(ch, cmd.ProcessState.ExitCode())
			}()
		}
	}
}

func exit(ch ssh.Channel, status int) {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], uint32(status))
	_, _ = ch.SendRequest("exit-status", false, b[:])
	ch.Close()
}

// waitWriters waits (a safety net of 30 s) until n writers have ended; the
// count checks below say what is wrong when they have not.
func waitWriters(t *testing.T, h *writerHost, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for len(h.statuses()) < n && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
}

func (h *writerHost) statuses() []int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]int(nil), h.status...)
}

// The ledger drives the real guest's writer binary over SSH: the session
// stays up until Stop (the writer ends on stdin EOF, so the driver must keep
// stdin open), every journaled ack has its disk and RAM marker, and a second
// session continues after the first one's markers.
func TestWorkloadDrivesTheRealWriterOverSSH(t *testing.T) {
	l, h := realWriterLedger(t, false)
	g := Guest{Name: "real", Addr: h.addr}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i := range 2 {
		// Stop ends the session; the writer ends on the stdin EOF that
		// follows, and may write a marker or two before it reads it. The
		// next writer's --start auto sees what is on disk when it starts, so
		// wait for the previous writer to be gone before reading the dirs.
		waitWriters(t, h, i)
		// --start auto: after the highest marker present (none at first)
		want := 1
		for _, d := range []string{h.disk, h.ram} {
			ents, _ := os.ReadDir(d)
			for _, e := range ents {
				want = max(want, writerproto.Seq(e.Name())+1)
			}
		}
		w, err := l.StartWorkload(ctx, g, WorkloadOpts{Rate: 400})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Stop() // a no-op after the Stop below; ends the session if a check fails first
		if w.First != want {
			t.Fatalf("session %d: first seq %d, want %d", i, w.First, want)
		}
		if err := w.WaitAcks(ctx, 40); err != nil {
			t.Fatal(err)
		}
		st := w.Stop()
		if st.Err != nil || st.Acks < 40 || !strings.HasPrefix(st.End, "stopped by the harness") {
			t.Fatalf("session %d: %+v", i, st)
		}
	}
	entries, _, err := ReadJournal(l.JournalPath())
	if err != nil {
		t.Fatal(err)
	}
	hist := WorkloadFromJournal(entries, g.Name)
	if hist.Sessions != 2 || hist.First != 1 || len(hist.Acks) < 80 {
		t.Fatalf("journal: %d sessions, first %d, %d acks", hist.Sessions, hist.First, len(hist.Acks))
	}
	boot, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	for _, b := range hist.BootIDs {
		if b != strings.TrimSpace(string(boot)) {
			t.Fatalf("boot id %q, want the host's %q", b, boot)
		}
	}
	for i, a := range hist.Acks {
		if i > 0 && a.Seq <= hist.Acks[i-1].Seq {
			t.Fatalf("ack %d is seq %d after seq %d", i, a.Seq, hist.Acks[i-1].Seq)
		}
		for _, d := range []string{h.disk, h.ram} {
			if _, err := os.Stat(filepath.Join(d, writerproto.Marker(a.Seq))); err != nil {
				t.Fatalf("journaled ack of seq %d: %v", a.Seq, err)
			}
		}
	}
	// both writers ended with their sessions, not by a kill
	waitWriters(t, h, 2)
	for _, s := range h.statuses() {
		if s != 0 && s != 141 {
			t.Fatalf("writer exit statuses %v, want 0 (stdin EOF) or 141 (stdout closed)", h.statuses())
		}
	}
	if n := len(h.statuses()); n != 2 {
		t.Fatalf("%d writers ended, want 2", n)
	}
}

// A guest without the writer (an image from before it) answers 127: the
// driver reports it as a CommandError the runner turns into its note.
func TestWorkloadOnAGuestWithoutTheWriter(t *testing.T) {
	l, h := realWriterLedger(t, true)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	w, err := l.StartWorkload(ctx, Guest{Name: "old", Addr: h.addr}, WorkloadOpts{})
	var ce *CommandError
	if w != nil || !errors.As(err, &ce) || ce.Status != 127 || !strings.Contains(ce.Stderr, "not found") {
		t.Fatalf("got %v, %v; want a CommandError with status 127", w, err)
	}
}
