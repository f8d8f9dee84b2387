package injector

import (
	"context"
	"fmt"
)

func newSandbox(ctx context.Context, stateDir string) (Supervisor, error) {
	return nil, fmt.Errorf("%w: sandbox not built yet", ErrUnavailable)
}

func removeSandboxScratch(dir string) {}
