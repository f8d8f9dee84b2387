// Package fakech is the fake cloud-hypervisor: a drop-in binary that speaks
// CH's CLI and REST API (v51 behaviour by default, v53 selectable), models
// its timing (scaled by VMCHAOS_TIME_SCALE), hits the ch.* failpoints, and
// runs a fake guest whose disk is a guestimg image file, whose RAM is process
// state captured by vm.snapshot, and whose SSH server listens on each NIC's
// loopback address. See docs/fakech.md.
package fakech

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vmchaos/vmchaos/failpoint"
	"github.com/vmchaos/vmchaos/timescale"
	"golang.org/x/sys/unix"
)

// exitError is a failure that ends the process with CH's error-chain output
// on stderr and exit status 1.
type exitError struct{ chain []string }

func (e *exitError) Error() string { return strings.Join(e.chain, ": ") }

func chainExit(chain ...string) *exitError { return &exitError{chain: chain} }

func printChain(w io.Writer, chain []string) {
	fmt.Fprintln(w, "Error: Cloud Hypervisor exited with the following chain of errors:")
	for i, c := range chain {
		fmt.Fprintf(w, "  %d: %s\n", i, c)
	}
}

// Main runs fakech with argv (without the program name) and returns the exit
// status: 0 clean exit, 1 VMM error (CH's chain on stderr), 2 usage error.
func Main(args []string, stdout, stderr io.Writer) int {
	compat, err := ParseCompat(os.Getenv(EnvCompat))
	if err != nil {
		printChain(stderr, []string{"fakech configuration", err.Error()})
		return 1
	}
	opts, err := ParseArgsFor(compat, args)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	if opts.Help {
		fmt.Fprint(stdout, HelpText())
		return 0
	}
	if opts.Version {
		fmt.Fprintf(stdout, "cloud-hypervisor %s\n", compat.BuildVersion())
		return 0
	}
	if err := run(opts, compat, stderr); err != nil {
		var ee *exitError
		if !errors.As(err, &ee) {
			ee = chainExit(err.Error())
		}
		printChain(stderr, ee.chain)
		return 1
	}
	return 0
}

func run(opts *Options, compat Compat, stderr io.Writer) error {
	clk, err := configureFromEnv()
	if err != nil {
		return err
	}
	defer failpoint.Close() // a clean exit accounts for its trace
	log, err := newLogger(opts.LogFile, opts.Verbosity, stderr)
	if err != nil {
		return chainExit("Error creating log file", osErrText(err))
	}
	defer log.close()

	// CH binds the API socket before it parses the VM config, so a config
	// error exits 1 after the socket briefly existed.
	sock, vmID, err := bindCLISocket(opts, compat)
	if err != nil {
		return err
	}
	if sock != nil {
		defer sock.keepLock()
	}
	vmm := NewVMM(compat, clk, vmID, log, opts.NoShutdown)
	if opts.EventMonitor != "" {
		em, err := openEventMonitor(opts.EventMonitor, log.start)
		if err != nil {
			return chainExit("Error creating event monitor", err.Error())
		}
		defer em.close()
		vmm.events = em
		em.emit("vmm", "starting", nil)
	}
	srv := &server{vmm: vmm}
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	// The API serves from the moment the socket is bound. CH's main thread
	// then parses the CLI config and sends create+boot (or restore) to the
	// VMM thread like any API request (cloud-hypervisor/src/main.rs
	// start_vmm): a vmm.ping that arrives first answers 200 while the VM
	// does not exist yet, and vm.info says "VM is not created". Requests that
	// arrive after the CLI's request queue behind it.
	if sock != nil {
		go srv.serve(sock.ln)
	}
	if opts.Boots() || opts.Restore != "" {
		if err := startCLIVM(vmm, opts, clk, vmID); err != nil {
			return err
		}
	}

	code := waitForExit(vmm, sigs, log)
	if sock != nil {
		sock.closeClean()
	}
	// The serial manager's drop removes its socket on every exit that runs
	// it (not on kill -9).
	vmm.mu.Lock()
	vmm.closeSerial()
	vmm.mu.Unlock()
	if code != 0 {
		return chainExit(fmt.Sprintf("VMM exited with code %d", code))
	}
	return nil
}

// configureFromEnv reads the timing, time scale and jitter seed from the
// environment into the VMM's clock, and arms the failpoints.
func configureFromEnv() (*clock, error) {
	timing, err := ParseTiming(os.Getenv(EnvTiming))
	if err != nil {
		return nil, chainExit("fakech configuration", err.Error())
	}
	scale, err := timescale.Parse(os.Getenv(timescale.Env))
	if err != nil {
		return nil, chainExit("fakech configuration", err.Error())
	}
	clk, err := newClock(timing, scale, os.Getenv(EnvJitterSeed))
	if err != nil {
		return nil, chainExit("fakech configuration", err.Error())
	}
	if err := failpoint.Init("fakech"); err != nil {
		return nil, chainExit("fakech configuration", err.Error())
	}
	return clk, nil
}

// bindCLISocket binds --api-socket, if given (sock nil otherwise), and names
// the VM after the socket's dir.
func bindCLISocket(opts *Options, compat Compat) (sock *apiSocket, vmID string, _ error) {
	if opts.APISocket == "" {
		return nil, "", nil
	}
	spec, err := ParseAPISocket(opts.APISocket)
	if err != nil {
		return nil, "", chainExit("Error parsing --api-socket", err.Error())
	}
	if sock, err = bindAPISocket(spec, compat); err != nil {
		// CH binds in start_vmm_thread; main wraps its error as
		// StartVmmThread (cloud-hypervisor/src/main.rs; conformance
		// TestRowExistingAPISocketPath).
		var ee *exitError
		if errors.As(err, &ee) {
			return nil, "", chainExit(append([]string{"Failed to start the VMM thread"}, ee.chain...)...)
		}
		return nil, "", err
	}
	if spec.Path != "" {
		vmID = filepath.Base(filepath.Dir(spec.Path))
	}
	return sock, vmID, nil
}

// waitForExit waits for an exit request (its code) or a signal (code 0).
func waitForExit(vmm *VMM, sigs <-chan os.Signal, log *logger) int {
	select {
	case code := <-vmm.exitReq:
		log.infof("VMM exit requested (code %d)", code)
		return code
	case s := <-sigs:
		// Graceful like CH: the VMM thread finishes the request in hand,
		// then shuts the VM down and exits 0.
		log.infof("received %v: shutting down", s)
		vmm.mu.Lock()
		if vmm.state != "" {
			vmm.event("shutdown", nil)
			vmm.teardown()
			_ = vmm.hit("ch.shutdown", failpoint.Attrs{"signal": s.String()})
		}
		vmm.mu.Unlock()
		return 0
	}
}

// startCLIVM sends the CLI's create+boot (or restore) to the VMM after CH's
// CLI start-up time.
func startCLIVM(vmm *VMM, opts *Options, clk *clock, vmID string) error {
	_ = failpoint.Hit(context.Background(), "ch.cli.start", failpoint.Attrs{"vm": vmID})
	_ = timescale.SleepRaw(context.Background(), clk.d(clk.t.CLIStart))
	vmm.mu.Lock()
	defer vmm.mu.Unlock()
	return startFromCLI(vmm, opts)
}

// startFromCLI creates and boots the CLI's VM, or restores --restore; called
// with vmm.mu held.
func startFromCLI(vmm *VMM, opts *Options) error {
	step, err := "", error(nil)
	switch {
	case opts.Boots():
		cfg, perr := BuildConfig(opts)
		if perr != nil {
			return chainExit("Error parsing config", perr.Error())
		}
		if _, cerr := vmm.create(cfg); cerr != nil {
			step, err = "Error creating VM", cerr
			break
		}
		step, err = "Error booting VM", vmm.boot()
	case opts.Restore != "":
		rc, perr := ParseRestoreFor(vmm.compat, opts.Restore)
		if perr != nil {
			return chainExit("Error parsing --restore", perr.Error())
		}
		step, err = "Error restoring VM", vmm.Restore(rc)
	}
	if err == nil {
		return nil
	}
	var ae *apiError
	if errors.As(err, &ae) {
		// Drop the API's outer "Error from API": this came from the CLI.
		return chainExit(append([]string{step}, ae.chain[1:]...)...)
	}
	return chainExit(step, err.Error())
}

// apiSocket is the bound API listener.
type apiSocket struct {
	ln   *net.UnixListener
	path string   // "" for fd=
	lock *os.File // v53: the OFD lock on <path>.lock, held for the process's life
}

// bindAPISocket binds like the selected CH release: v51 fails with
// EADDRINUSE on any existing path (stale or live); v53 takes an OFD lock on
// <path>.lock, refuses while a live instance holds it, else unlinks a stale
// socket and binds.
func bindAPISocket(spec APISocketSpec, compat Compat) (*apiSocket, error) {
	if spec.Path == "" {
		f := os.NewFile(uintptr(spec.FD), "api-socket")
		if f == nil {
			return nil, chainExit("Error creation API server's socket", "Bad file descriptor (os error 9)")
		}
		l, err := net.FileListener(f)
		f.Close()
		if err != nil {
			return nil, chainExit("Error creation API server's socket", err.Error())
		}
		ul, ok := l.(*net.UnixListener)
		if !ok {
			l.Close()
			return nil, chainExit("Error creation API server's socket", "fd is not a unix socket")
		}
		ul.SetUnlinkOnClose(false)
		return &apiSocket{ln: ul}, nil
	}
	s := &apiSocket{path: spec.Path}
	if compat == CompatV53 {
		lf, err := os.OpenFile(spec.Path+".lock", os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return nil, chainExit("Error creation API server's socket", "Failed to open lock file", osErrText(err))
		}
		lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0}
		if err := unix.FcntlFlock(lf.Fd(), unix.F_OFD_SETLK, &lk); err != nil {
			lf.Close()
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EACCES) {
				return nil, chainExit(fmt.Sprintf("API socket %q is already in use by another running instance", spec.Path))
			}
			return nil, chainExit("Error creation API server's socket", "Failed to lock "+spec.Path+".lock", osErrText(err))
		}
		s.lock = lf
		if err := os.Remove(spec.Path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, chainExit("Error creation API server's socket", osErrText(err))
		}
	}
	// CH creates the socket under umask 077: srwx------.
	old := unix.Umask(0o077)
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: spec.Path, Net: "unix"})
	unix.Umask(old)
	if err != nil {
		var se *os.SyscallError
		if errors.As(err, &se) {
			return nil, chainExit("Error creation API server's socket", osErrText(se.Err))
		}
		return nil, chainExit("Error creation API server's socket", err.Error())
	}
	// The socket file goes only on a clean exit; a failed start or a crash
	// leaves it behind, as CH v51/v53 do.
	l.SetUnlinkOnClose(false)
	s.ln = l
	return s, nil
}

func (s *apiSocket) closeClean() {
	s.ln.Close()
	if s.path != "" {
		_ = os.Remove(s.path)
	}
}

// keepLock holds the lock file open until run returns (an unreferenced
// *os.File would be closed by its finalizer, dropping the OFD lock).
func (s *apiSocket) keepLock() {
	if s.lock != nil {
		s.lock.Close()
	}
}

// server is the API's HTTP/1.1 front end: connections are read in parallel,
// requests execute one at a time under the VMM lock.
type server struct {
	vmm *VMM
}

func (s *server) serve(ln *net.UnixListener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go s.serveConn(c)
	}
}

func (s *server) serveConn(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	for {
		raw, bad, err := readRequest(br, c)
		if err != nil {
			return
		}
		if bad != nil {
			_ = writeResponse(c, bad)
			return
		}
		resp := s.handle(raw)
		if err := writeResponse(c, resp); err != nil {
			return
		}
		s.vmm.afterReply()
		if resp.close {
			return
		}
	}
}

func (s *server) handle(raw *rawRequest) *response {
	c, bad := decodeCall(raw)
	if bad != nil {
		return bad
	}
	return s.vmm.Handle(c)
}

// logger writes CH-like log lines at the -v level.
type logger struct {
	mu    sync.Mutex
	w     io.Writer
	f     *os.File
	level int // 0 warn, 1 info, 2 debug
	start time.Time
}

func newLogger(path string, verbosity int, stderr io.Writer) (*logger, error) {
	l := &logger{w: stderr, level: verbosity, start: time.Now()}
	if path != "" {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
		if err != nil {
			return nil, err
		}
		l.f, l.w = f, f
	}
	return l, nil
}

func (l *logger) close() {
	if l != nil && l.f != nil {
		l.f.Close()
	}
}

func (l *logger) logf(level int, tag, format string, a ...any) {
	if l == nil || level > l.level {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintf(l.w, "cloud-hypervisor: %.6fms: <fakech> %s -- %s\n", float64(time.Since(l.start).Nanoseconds())/1e6, tag, fmt.Sprintf(format, a...))
}

func (l *logger) warnf(format string, a ...any)  { l.logf(0, "WARN", format, a...) }
func (l *logger) infof(format string, a ...any)  { l.logf(1, "INFO", format, a...) }
func (l *logger) debugf(format string, a ...any) { l.logf(2, "DEBUG", format, a...) }
