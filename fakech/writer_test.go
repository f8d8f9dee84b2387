package fakech

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/fakech/guestimg"
)

// ackLine is one parsed writer ack.
type ackLine struct {
	seq        int
	begin, ack int64
}

// runWriter starts the writer in the background; lines arrive on the
// returned channel, which closes when the writer returned (its status on
// status).
func runWriter(ctx context.Context, g *guest, args string) (<-chan string, <-chan int) {
	pr, pw := io.Pipe()
	lines := make(chan string, 100000)
	status := make(chan int, 1)
	var stderr strings.Builder
	go func() {
		st := g.run(ctx, WriterCmd+" "+args, pw, &stderr)
		if st != 0 {
			_ = pw.CloseWithError(fmt.Errorf("status %d: %s", st, stderr.String()))
		} else {
			pw.Close()
		}
		status <- st
	}()
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	return lines, status
}

func parseAck(t *testing.T, ln string) ackLine {
	t.Helper()
	var a ackLine
	if _, err := fmt.Sscanf(ln, "ack %d %d %d", &a.seq, &a.begin, &a.ack); err != nil {
		t.Fatalf("ack line %q: %v", ln, err)
	}
	if a.begin <= 0 || a.ack < a.begin {
		t.Fatalf("ack line %q: begin/ack out of order", ln)
	}
	return a
}

func markerSet(names []string) map[int]bool {
	out := map[int]bool{}
	for _, n := range names {
		if s := writerSeq(n); s > 0 {
			out[s] = true
		}
	}
	return out
}

func TestWriterAcksOnlyDurableMarkers(t *testing.T) {
	g, p := testGuest(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	lines, status := runWriter(ctx, g, "--rate 2000 --count 50 --start 7")
	var all []string
	for ln := range lines {
		all = append(all, ln)
	}
	if st := <-status; st != 0 {
		t.Fatalf("writer exited %d", st)
	}
	if len(all) != 51 || all[0] != "start 7 "+g.bootID {
		t.Fatalf("want a start line with the boot id and 50 acks, got %d lines, first %q", len(all), all[0])
	}
	// every acked marker is in the image file itself, not just the page cache
	img, err := guestimg.Load(p)
	if err != nil {
		t.Fatal(err)
	}
	for i, ln := range all[1:] {
		a := parseAck(t, ln)
		if a.seq != 7+i {
			t.Fatalf("ack %d: seq %d, want %d", i, a.seq, 7+i)
		}
		name := fmt.Sprintf("seq-%d", a.seq)
		if _, ok := img.Files[WriterDiskDir+"/"+name]; !ok {
			t.Fatalf("acked %s is not in the synced image", name)
		}
		if _, ok := g.ram.Files[WriterRAMDir+"/"+name]; !ok {
			t.Fatalf("acked %s has no RAM marker", name)
		}
	}
}

func TestWriterMakesNoProgressWhilePaused(t *testing.T) {
	g, _ := testGuest(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	lines, status := runWriter(ctx, g, "--rate 500")
	var mu sync.Mutex
	var acks []ackLine
	collected := make(chan struct{})
	go func() {
		defer close(collected)
		for ln := range lines {
			if strings.HasPrefix(ln, "ack ") {
				a := parseAck(t, ln)
				mu.Lock()
				acks = append(acks, a)
				mu.Unlock()
			}
		}
	}()
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(acks) }
	waitFor := func(n int) {
		for count() < n {
			if ctx.Err() != nil {
				t.Fatalf("writer stalled at %d acks, want %d", count(), n)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	waitFor(20)
	// Judged by the writer's own stamps, not by when acks arrive here: acks
	// written before the pause may still be in the pipe for a while on a
	// loaded machine.
	g.setRunning(false)
	pausedAt := failpoint.Now()
	time.Sleep(150 * time.Millisecond)
	resumedAt := failpoint.Now()
	g.setRunning(true)
	waitFor(count() + 20)
	cancel()
	if st := <-status; st != 0 {
		t.Fatalf("writer exited %d after its session ended", st)
	}
	<-collected
	mu.Lock()
	defer mu.Unlock()
	for i, a := range acks {
		if a.seq != acks[0].seq+i {
			t.Fatalf("ack %d has seq %d: the stream has a gap", i, a.seq)
		}
		if a.ack > pausedAt && a.begin < resumedAt {
			t.Fatalf("seq %d written inside the pause (begin %d ack %d, paused %d..%d)", a.seq, a.begin, a.ack, pausedAt, resumedAt)
		}
	}
	if last := acks[len(acks)-1]; last.begin < resumedAt {
		t.Fatalf("no marker begun after the resume (last seq %d began %d, resumed %d)", last.seq, last.begin, resumedAt)
	}
}

// A snapshot holds the writer's RAM markers and unsynced page cache; a guest
// restored from it continues the sequence from the captured state.
func TestWriterRestoreContinuesFromCapturedState(t *testing.T) {
	g, p := testGuest(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	lines, status := runWriter(ctx, g, "--rate 2000 --count 30")
	for range lines {
	}
	if st := <-status; st != 0 {
		t.Fatalf("writer exited %d", st)
	}
	// an unsynced write rides in the page cache, which is RAM
	if _, _, st := sh(g, "touch "+WriterDiskDir+"/unsynced"); st != 0 {
		t.Fatal("touch failed")
	}
	g.setRunning(false)
	mem := g.capture()
	img, err := guestimg.Load(p)
	if err != nil {
		t.Fatal(err)
	}
	r := restoreGuest(p, img, mem)
	r.setRunning(true)
	if r.bootID != g.bootID {
		t.Fatal("restore changed the boot id")
	}
	disk := markerSet(r.list(WriterDiskDir))
	ram := markerSet(r.list(WriterRAMDir))
	for s := 1; s <= 30; s++ {
		if !disk[s] || !ram[s] {
			t.Fatalf("seq %d missing after restore (disk %v ram %v)", s, disk[s], ram[s])
		}
	}
	if _, ok := r.disk.Files[WriterDiskDir+"/unsynced"]; !ok {
		t.Fatal("the captured page cache was not restored")
	}
	lines, status = runWriter(ctx, r, "--rate 2000 --count 3 --start auto")
	var got []string
	for ln := range lines {
		got = append(got, ln)
	}
	<-status
	if len(got) != 4 || got[0] != "start 31 "+g.bootID || parseAck(t, got[1]).seq != 31 {
		t.Fatalf("restored writer did not continue at 31: %q", got)
	}
}

func TestWriterArgs(t *testing.T) {
	g, _ := testGuest(t)
	for _, args := range []string{"--rate 0", "--rate x", "--start 0", "--count -1", "--dir /run/x", "--ram-dir /var/x", "--bogus 1", "--rate"} {
		if _, _, st := sh(g, WriterCmd+" "+args); st != 2 {
			t.Errorf("%s %s: status %d, want 2", WriterCmd, args, st)
		}
	}
}
