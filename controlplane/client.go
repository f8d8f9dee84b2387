package controlplane

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/vmchaos/vmchaos/internal/unixhttp"
)

// Client speaks the control plane's API over its unix socket.
type Client struct {
	c *unixhttp.Client
}

// NewClient returns a client of the control plane listening at sock;
// timeout bounds each request (the control plane may be cut off).
func NewClient(sock string, timeout time.Duration) *Client {
	return &Client{c: unixhttp.New(sock, "control plane", timeout)}
}

// List returns every VM of the control plane.
func (c *Client) List(ctx context.Context) ([]VM, error) {
	var out []VM
	err := c.c.Do(ctx, http.MethodGet, "/v1/vms", nil, &out)
	return out, err
}

// Place puts name's intent and placement.
func (c *Client) Place(ctx context.Context, name string, p Placement) (VM, error) {
	var out VM
	err := c.c.Do(ctx, http.MethodPut, "/v1/vms/"+name, p, &out)
	return out, err
}

// Release tells the control plane that node gave name up.
func (c *Client) Release(ctx context.Context, name, node string) (VM, error) {
	var out VM
	err := c.c.Do(ctx, http.MethodPost, "/v1/vms/"+name+"/release", Release{Node: node}, &out)
	return out, err
}

// Serve serves s on a unix socket at sock until Close of the returned
// server; the socket file is replaced if it exists.
func Serve(s *Server, sock string) (*http.Server, error) {
	_ = os.Remove(sock)
	l, err := net.Listen("unix", sock)
	if err != nil {
		return nil, fmt.Errorf("control plane: listen %s: %w", sock, err)
	}
	srv := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(l) }()
	return srv, nil
}
