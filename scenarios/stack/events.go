package stack

import (
	"context"
	"net/http"

	agentapi "github.com/vmchaos/vmchaos/nodeagent/api"
)

// Events returns the agent's events and its operation budgets
// (GET /v1/events): what a wedge looks like from outside the node.
func (c *AgentClient) Events(ctx context.Context) (agentapi.Events, error) {
	var out agentapi.Events
	err := c.do(ctx, http.MethodGet, agentapi.EventsPath, nil, &out)
	return out, err
}
