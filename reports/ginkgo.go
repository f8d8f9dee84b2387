package reports

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/vmchaos/vmchaos/durable"
)

// GinkgoFile is Ginkgo's JSON report in a run dir: an array of suite reports.
const GinkgoFile = "ginkgo.json"

// MergeGinkgo joins the ginkgo.json of each shard dir into outDir/ginkgo.json:
// one array holding every shard's suite report, the shape Ginkgo itself writes
// for several suites, so tools that read one run's file read the merge too.
// It returns the shard dirs that had no ginkgo.json (a runner killed before
// Ginkgo wrote it); a file that is not a JSON array is an error.
func MergeGinkgo(outDir string, shardDirs []string) (missing []string, err error) {
	all := []json.RawMessage{}
	for _, dir := range shardDirs {
		b, err := os.ReadFile(filepath.Join(dir, GinkgoFile))
		if errors.Is(err, fs.ErrNotExist) {
			missing = append(missing, dir)
			continue
		}
		if err != nil {
			return nil, err
		}
		var suites []json.RawMessage
		if err := json.Unmarshal(b, &suites); err != nil {
			return nil, fmt.Errorf("%s: not a Ginkgo JSON report: %w", filepath.Join(dir, GinkgoFile), err)
		}
		all = append(all, suites...)
	}
	if len(all) == 0 {
		return missing, nil
	}
	b, err := json.MarshalIndent(all, "", "  ")
	if err != nil {
		return nil, err
	}
	return missing, durable.WriteFile(filepath.Join(outDir, GinkgoFile), b, 0o644)
}
