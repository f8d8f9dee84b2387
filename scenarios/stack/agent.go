package stack

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"time"

	agentapi "github.com/vmchaos/vmchaos/nodeagent/api"
)

// AgentClient speaks the agent's intent API (HTTP over <state>/agent.sock).
type AgentClient struct {
	sock string
	http *http.Client
}

// NewAgentClient returns a client for the agent socket at sock.
func NewAgentClient(sock string) *AgentClient {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
		// The agent restarts under us: never reuse a connection to a dead
		// process.
		DisableKeepAlives: true,
	}
	return &AgentClient{sock: sock, http: &http.Client{Transport: tr, Timeout: 10 * time.Second}}
}

// APIError is a 4xx/5xx answer of the agent.
type APIError struct {
	Status  int
	Message string
}

func (e *APIError) Error() string { return fmt.Sprintf("agent API %d: %s", e.Status, e.Message) }

// ErrNotFound is returned by Get for an unknown VM.
var ErrNotFound = errors.New("agent: vm not found")

func (c *AgentClient) do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://agent"+path, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("agent %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if resp.StatusCode >= 400 {
		var ae agentapi.APIError
		_ = json.Unmarshal(b, &ae)
		if ae.Error == "" {
			ae.Error = string(bytes.TrimSpace(b))
		}
		if resp.StatusCode == http.StatusNotFound && method == http.MethodGet {
			return ErrNotFound
		}
		return &APIError{Status: resp.StatusCode, Message: ae.Error}
	}
	if out != nil && len(b) > 0 {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("agent %s %s: decode: %w", method, path, err)
		}
	}
	return nil
}

// Put sets the intent of name.
func (c *AgentClient) Put(ctx context.Context, name string, in agentapi.Intent) error {
	return c.do(ctx, http.MethodPut, "/v1/vms/"+url.PathEscape(name), in, nil)
}

// Delete asks for name to be deleted.
func (c *AgentClient) Delete(ctx context.Context, name string) error {
	return c.do(ctx, http.MethodDelete, "/v1/vms/"+url.PathEscape(name), nil, nil)
}

// Get returns one VM's view; ErrNotFound when the agent forgot it.
func (c *AgentClient) Get(ctx context.Context, name string) (agentapi.VMView, error) {
	var v agentapi.VMView
	err := c.do(ctx, http.MethodGet, "/v1/vms/"+url.PathEscape(name), nil, &v)
	return v, err
}

// List returns every VM the agent knows.
func (c *AgentClient) List(ctx context.Context) ([]agentapi.VMView, error) {
	var raw json.RawMessage
	if err := c.do(ctx, http.MethodGet, "/v1/vms", nil, &raw); err != nil {
		return nil, err
	}
	// Accept both a bare array and {"vms":[...]}.
	var vs []agentapi.VMView
	if err := json.Unmarshal(raw, &vs); err == nil {
		return vs, nil
	}
	var wrap struct {
		VMs []agentapi.VMView `json:"vms"`
	}
	if err := json.Unmarshal(raw, &wrap); err != nil {
		return nil, fmt.Errorf("agent list: decode: %w", err)
	}
	return wrap.VMs, nil
}

// WaitUp waits until the agent answers GET /v1/vms.
func (c *AgentClient) WaitUp(ctx context.Context) error {
	for {
		if _, err := c.List(ctx); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("agent at %s not answering: %w", c.sock, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}
