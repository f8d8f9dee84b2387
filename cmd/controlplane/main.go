// Command controlplane serves the cluster's control plane
// (docs/controlplane.md) as its own process: its state in a file written
// durably before every answer, its API on a unix socket. The harness runs
// it as a unit, so a SIGKILL, a stop or a restart of it mid-migration is a
// fault like any other; the agents must ride through it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/vmchaos/vmchaos/controlplane"
	"github.com/vmchaos/vmchaos/internal/unixhttp"
)

func main() {
	sock := flag.String("socket", "", "unix socket to serve the API on (replaced if it exists)")
	state := flag.String("state", "", "the state file (created on the first change)")
	observer := flag.String("observer", "", "unix socket of an observer told every change, before a release takes effect (POST /v1/events); empty: none")
	flag.Parse()
	if err := run(*sock, *state, *observer); err != nil {
		fmt.Fprintln(os.Stderr, "controlplane:", err)
		os.Exit(1)
	}
}

func run(sock, state, observer string) error {
	if sock == "" || state == "" {
		return errors.New("--socket and --state are required")
	}
	s, err := controlplane.Open(state)
	if err != nil {
		return err
	}
	if observer != "" {
		c := unixhttp.New(observer, "observer", 30*time.Second)
		s.Observe = func(e controlplane.Event) {
			// synchronous: the observer judges a release before it
			// takes effect; one that does not answer is not waited on
			// past the timeout
			if err := c.Do(context.Background(), http.MethodPost, "/v1/events", e, nil); err != nil {
				fmt.Fprintln(os.Stderr, "controlplane: observer:", err)
			}
		}
	}
	srv, err := controlplane.Serve(s, sock)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "controlplane: serving %s, state %s, pid %d\n", sock, state, os.Getpid())
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return srv.Shutdown(ctx)
}
