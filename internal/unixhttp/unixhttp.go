// Package unixhttp is JSON over HTTP on a unix socket, the client side: the
// agent's client of the control plane (product) and the harness's client of
// the agent's API both speak it. It imports only the standard library, so
// the product may link it without linking the harness (internal/layers:
// a neutral leaf, listed in Product, allowed nothing of the module).
package unixhttp

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

// maxBody bounds what one answer may make a client read.
const maxBody = 4 << 20

// Client sends JSON requests to the server listening at a unix socket.
type Client struct {
	name string
	http *http.Client
}

// New returns a client of the server at sock; name is the server's name in
// every error ("agent", "control plane") and the host of its URLs; timeout
// bounds each request (0: none). Connections are never reused: the server
// may be killed and restarted under the client.
func New(sock, name string, timeout time.Duration) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
		DisableKeepAlives: true,
	}
	return &Client{name: name, http: &http.Client{Transport: tr, Timeout: timeout}}
}

// StatusError is a 4xx or 5xx answer: Message is the body's "error" field,
// or the body itself when it has none.
type StatusError struct {
	Name, Method, Path string
	Status             int
	Message            string
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("%s %s %s: %d: %s", e.Name, e.Method, e.Path, e.Status, e.Message)
}

// Do sends body (JSON, none when nil) as method on path and decodes the
// answer into out (skipped when out is nil or the answer empty). Every
// error names the server, the method and the path; an error answer is a
// *StatusError.
func (c *Client) Do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("%s %s %s: encode: %w", c.name, method, path, err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://"+hostOf(c.name)+path, rd)
	if err != nil {
		return fmt.Errorf("%s %s %s: %w", c.name, method, path, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s %s: %w", c.name, method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return fmt.Errorf("%s %s %s: read: %w", c.name, method, path, err)
	}
	if resp.StatusCode >= 400 {
		var ae struct {
			Error string `json:"error"`
		}
		_ = json.Unmarshal(b, &ae)
		if ae.Error == "" {
			ae.Error = string(bytes.TrimSpace(b))
		}
		return &StatusError{Name: c.name, Method: method, Path: path, Status: resp.StatusCode, Message: ae.Error}
	}
	if out != nil && len(b) > 0 {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("%s %s %s: decode: %w", c.name, method, path, err)
		}
	}
	return nil
}

// hostOf is name as a URL host (the socket is what is dialled; the host
// only names it in the request).
func hostOf(name string) string {
	out := []byte(name)
	for i, ch := range out {
		if ch == ' ' {
			out[i] = '-'
		}
	}
	return string(out)
}
