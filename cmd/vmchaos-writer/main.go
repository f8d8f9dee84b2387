// vmchaos-writer is the workload writer of the real guest (issue #13): the
// image (`vmchaos image real`) installs it at /usr/local/bin/vmchaos-writer
// and the ledger starts it over SSH. It speaks the fake guest's protocol
// (ledger/writerproto) on a real file system: per marker, seq-N is created in
// the disk dir and fsynced, the disk dir is fsynced once per batch (group
// commit), then seq-N is created in the RAM dir (/run, tmpfs), and only then
// is the marker acked. It ends on stdin EOF, SIGHUP, SIGINT, SIGTERM or a
// broken stdout: the SSH session ending. Built static (CGO_ENABLED=0) so it
// runs in any guest.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signal.Ignore(syscall.SIGPIPE) // a closed stdout is an EPIPE the writer answers, not a silent death
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGHUP, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		// stdin ends with the session that started the writer
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// run is the writer; its exit status: 0 ended (count reached or the session
// went away), 1 a marker could not be written, 2 bad arguments, 141 stdout
// broken (as the fake guest's writer).
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	w, err := newWriter(args)
	if err != nil {
		fmt.Fprintf(stderr, "%v\n%s\n", err, usage)
		return 2
	}
	return w.run(ctx, stdout, stderr)
}
