package stack

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/vmchaos/vmchaos/internal/unixhttp"
	agentapi "github.com/vmchaos/vmchaos/nodeagent/api"
)

// AgentClient speaks the agent's intent API (HTTP over <state>/agent.sock).
type AgentClient struct {
	sock string
	c    *unixhttp.Client
}

// NewAgentClient returns a client for the agent socket at sock. It never
// reuses a connection: the agent restarts under it.
func NewAgentClient(sock string) *AgentClient {
	return &AgentClient{sock: sock, c: unixhttp.New(sock, "agent", 10*time.Second)}
}

// APIError is a 4xx/5xx answer of the agent.
type APIError struct {
	Status  int
	Message string
}

func (e *APIError) Error() string { return fmt.Sprintf("agent API %d: %s", e.Status, e.Message) }

// ErrNotFound is returned by Get for an unknown VM.
var ErrNotFound = errors.New("agent: vm not found")

// do is unixhttp's Do with the agent's answers: a GET answered 404 is
// ErrNotFound, any other error answer an *APIError.
func (c *AgentClient) do(ctx context.Context, method, path string, body, out any) error {
	err := c.c.Do(ctx, method, path, body, out)
	var se *unixhttp.StatusError
	if !errors.As(err, &se) {
		return err
	}
	if se.Status == http.StatusNotFound && method == http.MethodGet {
		return ErrNotFound
	}
	return &APIError{Status: se.Status, Message: se.Message}
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
