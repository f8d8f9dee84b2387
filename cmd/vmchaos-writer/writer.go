package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/vmchaos/vmchaos/durable"
	"github.com/vmchaos/vmchaos/ledger/writerproto"
	"golang.org/x/sys/unix"
)

const usage = writerproto.Usage

// bootIDPath is the kernel's id of this boot (a restore keeps it, a reboot
// changes it).
const bootIDPath = "/proc/sys/kernel/random/boot_id"

type writer struct {
	o writerproto.Opts
}

// newWriter checks the arguments; its every error is a usage error.
func newWriter(args []string) (*writer, error) {
	o, err := writerproto.Parse(args)
	if err != nil {
		return nil, err
	}
	o.Disk, o.RAM = filepath.Clean(o.Disk), filepath.Clean(o.RAM)
	if o.Disk == o.RAM {
		return nil, fmt.Errorf("%s: --dir and --ram-dir are both %s: the disk and RAM markers need a dir each", writerproto.Cmd, o.Disk)
	}
	return &writer{o: o}, nil
}

// monoNs is CLOCK_MONOTONIC in ns, the guest's clock of the ack lines.
func monoNs() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

func (w *writer) run(ctx context.Context, stdout, stderr io.Writer) int {
	fail := func(err error) int {
		fmt.Fprintf(stderr, "%s: %v\n", writerproto.Cmd, err)
		return 1
	}
	boot, err := os.ReadFile(bootIDPath)
	if err != nil {
		return fail(fmt.Errorf("boot id: %w", err))
	}
	if err := mkdirDurable(w.o.Disk); err != nil {
		return fail(err)
	}
	if err := os.MkdirAll(w.o.RAM, 0o755); err != nil {
		return fail(err)
	}
	seq := w.o.Start
	if seq == 0 {
		// continue after the highest marker present: a restored guest
		// carries on from its captured state
		if seq, err = w.nextSeq(); err != nil {
			return fail(err)
		}
	}
	if _, err := io.WriteString(stdout, writerproto.StartLine(seq, strings.TrimSpace(string(boot)))); err != nil {
		return 141
	}
	p := writerproto.NewPacer(w.o, time.Now())
	for !p.Finished() {
		if !p.Wait(ctx) {
			return 0
		}
		now := time.Now()
		// A paused guest cannot tell its pause from a slow scheduler: the
		// catch-up after either is bounded by MaxBacklog.
		n := p.Batch(now, false)
		begin := monoNs()
		if err := w.markers(seq, n); err != nil {
			return fail(fmt.Errorf("seq %d: %w", seq, err))
		}
		if _, err := io.WriteString(stdout, writerproto.AckLines(seq, n, begin, monoNs())); err != nil {
			return 141
		}
		seq += n
		p.Synced(n, now)
	}
	return 0
}

// markers makes seq..seq+n-1 durable in the disk dir (each file fsynced,
// the dir fsynced once for all), then creates them in the RAM dir.
func (w *writer) markers(seq, n int) error {
	for i := 0; i < n; i++ {
		if err := createFile(filepath.Join(w.o.Disk, writerproto.Marker(seq+i)), true); err != nil {
			return err
		}
	}
	if err := durable.SyncDir(w.o.Disk); err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		if err := createFile(filepath.Join(w.o.RAM, writerproto.Marker(seq+i)), false); err != nil {
			return err
		}
	}
	return nil
}

func createFile(p string, sync bool) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	if sync {
		if err := f.Sync(); err != nil {
			f.Close()
			return fmt.Errorf("fsync %s: %w", p, err)
		}
	}
	return f.Close()
}

// nextSeq is one past the highest marker in the disk or the RAM dir.
func (w *writer) nextSeq() (int, error) {
	hi := 0
	for _, d := range []string{w.o.Disk, w.o.RAM} {
		ents, err := os.ReadDir(d)
		if err != nil {
			return 0, err
		}
		for _, e := range ents {
			hi = max(hi, writerproto.Seq(e.Name()))
		}
	}
	return hi + 1, nil
}

// mkdirDurable makes dir and fsyncs the parent of every directory it
// created, so the disk dir itself survives a crash.
func mkdirDurable(dir string) error {
	var missing []string
	for p := dir; ; p = filepath.Dir(p) {
		if _, err := os.Stat(p); err == nil || p == filepath.Dir(p) {
			break
		}
		missing = append(missing, p)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, p := range missing {
		if err := durable.SyncDir(filepath.Dir(p)); err != nil {
			return err
		}
	}
	return nil
}
