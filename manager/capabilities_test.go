package manager_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/vmchaos/vmchaos/manager"
)

// plain is a Manager that is not a CapabilityReporter: only create and rm.
type plain struct{ manager.Manager }

func (plain) Name() string { return "plain" }
func (plain) Command(c manager.Call) ([]string, error) {
	switch c.Verb {
	case manager.VerbCreate, manager.VerbRm:
		return []string{"/bin/plain", string(c.Verb), c.Name}, nil
	}
	return nil, fmt.Errorf("plain: %s: %w", c.Verb, manager.ErrNotSupported)
}

// Without a report the table comes from Command, and every feature is
// missing for want of one: an unknown is never a yes.
func TestCapabilitiesOfDerivesFromCommand(t *testing.T) {
	c, err := manager.CapabilitiesOf(context.Background(), plain{})
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Items) != len(manager.CapabilityNames) {
		t.Fatalf("%d rows, want %d", len(c.Items), len(manager.CapabilityNames))
	}
	if ok, why := c.Supports(string(manager.VerbCreate), string(manager.VerbRm)); !ok {
		t.Fatalf("create, rm: %s", why)
	}
	ok, why := c.Supports(string(manager.VerbClone), manager.FeatureEvents)
	if ok || !strings.HasPrefix(why, manager.NotSupportedPrefix) || !strings.Contains(why, "clone: plain: clone") ||
		!strings.Contains(why, "events: the plain adapter reports no features") {
		t.Fatalf("clone, events: %v %q", ok, why)
	}
	if ok, why := c.Supports("no-such-row"); ok || !strings.Contains(why, "no-such-row: not reported") {
		t.Fatalf("unknown row: %v %q", ok, why)
	}
	if len(c.Missing()) != len(manager.CapabilityNames)-2 {
		t.Fatalf("missing %d rows", len(c.Missing()))
	}
}

type reporter struct{ plain }

func (reporter) Capabilities(context.Context) (manager.Capabilities, error) {
	return manager.Capabilities{}, errors.New("boom")
}

func TestCapabilitiesOfUsesTheReport(t *testing.T) {
	if _, err := manager.CapabilitiesOf(context.Background(), reporter{}); err == nil || !strings.Contains(err.Error(), "plain capabilities: boom") {
		t.Fatalf("err = %v", err)
	}
}
