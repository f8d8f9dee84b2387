package chapi

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// Error is a non-2xx answer from the VMM: the status and CH's error chain,
// outermost first. Match on Status plus a substring of the last element.
type Error struct {
	Endpoint string
	Status   int
	Chain    []string
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s: HTTP %d: %s", e.Endpoint, e.Status, strings.Join(e.Chain, ": "))
}

// Innermost returns the last element of the chain.
func (e *Error) Innermost() string {
	if len(e.Chain) == 0 {
		return ""
	}
	return e.Chain[len(e.Chain)-1]
}

// IsInvalidTransition reports whether err is CH's InvalidStateTransition(from, to).
func IsInvalidTransition(err error, from, to string) bool {
	var e *Error
	if !errors.As(err, &e) {
		return false
	}
	want := fmt.Sprintf("InvalidStateTransition(%s, %s)", from, to)
	for _, s := range e.Chain {
		if strings.Contains(s, want) {
			return true
		}
	}
	return false
}

// HasMessage reports whether err is a CH error whose chain contains sub.
func HasMessage(err error, sub string) bool {
	var e *Error
	if !errors.As(err, &e) {
		return false
	}
	for _, s := range e.Chain {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// DecodeErrorBody turns a CH error body into a chain: a JSON array of strings
// (v47+), or plain text (≤v46).
func DecodeErrorBody(b []byte) []string {
	var chain []string
	if err := json.Unmarshal(b, &chain); err == nil {
		return chain
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return nil
	}
	return []string{s}
}

// Client talks to one VMM over its API socket.
type Client struct {
	Socket    string
	hc        *http.Client // used by KeepAlive clients
	keepAlive bool
}

// Option configures a Client.
type Option func(*http.Transport)

// KeepAlive reuses one connection across requests. Use it for tight polling
// of a VMM that is known to be alive (the checker, benchmarks): a connection to
// a VMM that was since killed fails the next request, which the caller sees as
// a dead VMM, exactly as with a fresh connection.
func KeepAlive() Option {
	return func(t *http.Transport) {
		t.DisableKeepAlives = false
		t.MaxIdleConnsPerHost = 1
	}
}

// New returns a client for the socket at path. By default each request gets
// its own connection: CH handles one request at a time anyway, and a
// short-lived CLI must not hold a connection to a VMM another process drives.
func New(socket string, opts ...Option) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
		DisableKeepAlives: true,
	}
	for _, o := range opts {
		o(tr)
	}
	return &Client{Socket: socket, hc: &http.Client{Transport: tr}, keepAlive: !tr.DisableKeepAlives}
}

// oneShot sends req on a connection of its own and reads the answer head:
// what http.Transport does with DisableKeepAlives, without its two goroutines
// per connection, which were half the time of a vm.info round trip on 2 cores
// (0.31 → 0.23 ms, fakech BenchmarkVMInfoRoundTrip). The returned func closes
// the connection after the body was read. ctx bounds the dial, the exchange
// and the body read.
func (c *Client) oneShot(ctx context.Context, req *http.Request) (*http.Response, func(), error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", c.Socket)
	if err != nil {
		return nil, nil, err
	}
	// The end of ctx (cancel or deadline) unblocks any read or write in
	// flight. Only this sets the connection's deadline, so an I/O error while
	// ctx.Err() != nil is always ctx's doing (a deadline of its own would
	// race the context's timer and surface as a bare i/o timeout).
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	done := func() { stop(); conn.Close() }
	req.Close = true // Connection: close, as the Transport sends without keep-alive
	fail := func(err error) (*http.Response, func(), error) {
		done()
		if ctx.Err() != nil {
			return nil, nil, ctx.Err()
		}
		return nil, nil, err
	}
	if err := req.Write(conn); err != nil {
		return fail(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		return fail(err)
	}
	return resp, done, nil
}

// Close releases idle connections of a KeepAlive client.
func (c *Client) Close() { c.hc.CloseIdleConnections() }

// Do sends one request. body nil means no body; otherwise it is JSON-encoded
// and sent with Content-Length (CH treats chunked bodies as absent). out, if
// non-nil, receives a JSON answer.
func (c *Client) Do(ctx context.Context, method, endpoint string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("%s: encode: %w", endpoint, err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://localhost/api/v1/"+endpoint, rd)
	if err != nil {
		return fmt.Errorf("%s: %w", endpoint, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	var resp *http.Response
	if c.keepAlive {
		resp, err = c.hc.Do(req)
	} else {
		var done func()
		resp, done, err = c.oneShot(ctx, req)
		if err == nil {
			defer done()
		}
	}
	if err != nil {
		return fmt.Errorf("%s: %w", endpoint, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return fmt.Errorf("%s: read answer: %w", endpoint, err)
	}
	if resp.StatusCode/100 != 2 {
		return &Error{Endpoint: endpoint, Status: resp.StatusCode, Chain: DecodeErrorBody(b)}
	}
	if out != nil && len(b) > 0 {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("%s: decode answer: %w", endpoint, err)
		}
	}
	return nil
}

// Ping calls vmm.ping.
func (c *Client) Ping(ctx context.Context) (VmmPingResponse, error) {
	var r VmmPingResponse
	err := c.Do(ctx, http.MethodGet, EpPing, nil, &r)
	return r, err
}

// WaitReady polls vmm.ping until it answers 200 or ctx ends. A socket file
// existing does not mean ready.
func (c *Client) WaitReady(ctx context.Context) error {
	var last error
	for {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := c.Ping(pctx)
		cancel()
		if err == nil {
			return nil
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for VMM at %s: %w (last: %v)", c.Socket, ctx.Err(), last)
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// WaitVM polls vm.info until the VM exists (the command-line VM of a VMM
// started with one). CH serves the API before its main thread has created
// that VM, so a ping that answers does not mean it exists: until then
// vm.info says "VM is not created". Any other answer from the VMM ends the
// wait; a transport error (the VMM not listening, or gone) is retried until
// ctx ends, like WaitReady.
func (c *Client) WaitVM(ctx context.Context) (VmInfo, error) {
	for {
		info, err := c.Info(ctx)
		var ce *Error
		if err == nil || errors.As(err, &ce) && !HasMessage(err, "VM is not created") {
			return info, err
		}
		select {
		case <-ctx.Done():
			return info, fmt.Errorf("wait for the VM at %s: %w (last: %v)", c.Socket, ctx.Err(), err)
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// Info calls vm.info.
func (c *Client) Info(ctx context.Context) (VmInfo, error) {
	var r VmInfo
	err := c.Do(ctx, http.MethodGet, EpInfo, nil, &r)
	return r, err
}

func (c *Client) action(ctx context.Context, ep string) error {
	return c.Do(ctx, http.MethodPut, ep, nil, nil)
}

// Pause pauses the VM. An already-paused VM counts as success when
// idempotent is set (CH answers 500 InvalidStateTransition(Paused, Paused)).
func (c *Client) Pause(ctx context.Context, idempotent bool) error {
	err := c.action(ctx, EpPause)
	if idempotent && IsInvalidTransition(err, StatePaused, StatePaused) {
		return nil
	}
	return err
}

// Resume resumes the VM; Running→Running counts as success when idempotent.
func (c *Client) Resume(ctx context.Context, idempotent bool) error {
	err := c.action(ctx, EpResume)
	if idempotent && IsInvalidTransition(err, StateRunning, StateRunning) {
		return nil
	}
	return err
}

// Boot calls vm.boot.
func (c *Client) Boot(ctx context.Context) error { return c.action(ctx, EpBoot) }

// Shutdown calls vm.shutdown.
func (c *Client) Shutdown(ctx context.Context) error { return c.action(ctx, EpShutdown) }

// Delete calls vm.delete.
func (c *Client) Delete(ctx context.Context) error { return c.action(ctx, EpDelete) }

// ShutdownVMM calls vmm.shutdown; the process then exits 0.
func (c *Client) ShutdownVMM(ctx context.Context) error { return c.action(ctx, EpShutdownVMM) }

// Create calls vm.create.
func (c *Client) Create(ctx context.Context, cfg VmConfig) error {
	return c.Do(ctx, http.MethodPut, EpCreate, cfg, nil)
}

// Snapshot writes a snapshot of a Paused VM into dir (which must exist).
func (c *Client) Snapshot(ctx context.Context, dir string) error {
	return c.Do(ctx, http.MethodPut, EpSnapshot, VmSnapshotConfig{DestinationURL: "file://" + dir}, nil)
}

// Restore restores from dir into a VMM with no config.
func (c *Client) Restore(ctx context.Context, cfg RestoreConfig) error {
	return c.Do(ctx, http.MethodPut, EpRestore, cfg, nil)
}

// AddNet hot-plugs a NIC. The answer body is absent if the VM is not booted.
func (c *Client) AddNet(ctx context.Context, n NetConfig) (PciDeviceInfo, error) {
	var r PciDeviceInfo
	err := c.Do(ctx, http.MethodPut, EpAddNet, n, &r)
	return r, err
}

// RemoveDevice removes a device by id.
func (c *Client) RemoveDevice(ctx context.Context, id string) error {
	return c.Do(ctx, http.MethodPut, EpRemoveDevice, VmRemoveDevice{ID: id}, nil)
}
