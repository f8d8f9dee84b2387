package reports

import (
	"encoding/json"
	"strings"
	"testing"
)

// A manager run's unsupported verbs reach results.json and report.md by
// name and reason, and the gate counts none of them as a pass.
func TestNotSupportedIsListedNeverPassed(t *testing.T) {
	r := &Results{RunID: "m", Cases: []Case{{ID: "mgr-clone-kill-at-35%", Verdict: Pass}},
		NotSupported: []NotRun{{Case: "mgr-restore-*", Missing: "restore",
			Reason: "not supported by this manager: restore: vmctl has no in-place restore", Kind: MissingManagerVerb}}}
	md, err := Markdown(r)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(md), "## Not supported by this manager") || !strings.Contains(string(md), "vmctl has no in-place restore") {
		t.Fatalf("report.md lacks the not-supported verb:\n%s", md)
	}
	b, err := json.Marshal(r)
	if err != nil || !strings.Contains(string(b), `"not_supported":[{"case":"mgr-restore-*"`) {
		t.Fatalf("results.json: %s %v", b, err)
	}
	if c := CountVerdicts(r.Cases); c.Pass != 1 {
		t.Fatalf("verdicts %+v: the unsupported verb must not count", c)
	}
}
