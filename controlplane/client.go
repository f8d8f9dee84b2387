package controlplane

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"
)

// Client speaks the control plane's API over its unix socket.
type Client struct {
	http *http.Client
}

// NewClient returns a client of the control plane listening at sock;
// timeout bounds each request (the control plane may be cut off).
func NewClient(sock string, timeout time.Duration) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
		DisableKeepAlives: true,
	}
	return &Client{http: &http.Client{Transport: tr, Timeout: timeout}}
}

// List returns every VM of the control plane.
func (c *Client) List(ctx context.Context) ([]VM, error) {
	var out []VM
	err := c.do(ctx, http.MethodGet, "/v1/vms", nil, &out)
	return out, err
}

// Place puts name's intent and placement.
func (c *Client) Place(ctx context.Context, name string, p Placement) (VM, error) {
	var out VM
	err := c.do(ctx, http.MethodPut, "/v1/vms/"+name, p, &out)
	return out, err
}

// Release tells the control plane that node gave name up.
func (c *Client) Release(ctx context.Context, name, node string) (VM, error) {
	var out VM
	err := c.do(ctx, http.MethodPost, "/v1/vms/"+name+"/release", Release{Node: node}, &out)
	return out, err
}

func (c *Client) do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://controlplane"+path, rd)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("control plane %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if resp.StatusCode >= 400 {
		var ae apiError
		_ = json.Unmarshal(b, &ae)
		return fmt.Errorf("control plane %s %s: %d: %s", method, path, resp.StatusCode, ae.Error)
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("control plane %s %s: decode: %w", method, path, err)
	}
	return nil
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
