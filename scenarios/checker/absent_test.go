package checker

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/vmchaos/vmchaos/ledger"
	"github.com/vmchaos/vmchaos/reports"
)

// TestNoHistoryInvariantPassesOnAbsentData (issue #31 item 2): each history
// invariant that judges data fed empty, missing and unreadable data fails,
// never passes; where the only failure is the harness's own read (the
// ledger journal), it is marked a harness error, and everywhere else it is
// the product's fail.
func TestNoHistoryInvariantPassesOnAbsentData(t *testing.T) {
	okVerdict := ledger.Verdict{Guest: "a", Stable: 2, OK: true, Message: "guest a: 2 stable, 0 in-flight"}
	noMarkers := ledger.Classify("a", nil, ledger.Observed{Disk: []string{}})
	journalGone := fmt.Errorf("verify: ledger a: verify: %w: read /run/ledger.jsonl: no such file", ledger.ErrJournal)
	sshDown := errors.New("verify: ledger a: ssh: connection refused")
	two := func(first, last map[string]float64) []Sample {
		types := map[string]string{"nodeagent_wake_total": "counter", "nodeagent_up": "gauge"}
		return []Sample{{TsNs: 1, Values: first, Types: types}, {TsNs: 2, Values: last, Types: types}}
	}
	wake := `nodeagent_wake_total{result="ok"}`
	want := []MetricWant{{Series: wake, Min: 0, Max: 0}}
	for _, tc := range []struct {
		name    string
		inv     reports.Invariant
		harness bool
		want    string
	}{
		{"ledger: no guest verified (empty)", LedgerCleanInvariant(nil), false, "no guest was verified"},
		{"ledger: a guest without an acked marker (empty)", LedgerCleanInvariant([]LedgerResult{{Guest: "a", Verdict: noMarkers}}), false, "no acked marker"},
		{"ledger: a verdict with no stable marker (empty)", LedgerCleanInvariant([]LedgerResult{{Guest: "a", Verdict: ledger.Verdict{Guest: "a", OK: true}}}), false, "a:"},
		{"ledger: the journal is gone (missing)", LedgerCleanInvariant([]LedgerResult{{Guest: "a", Err: journalGone}}), true, "ledger journal unreadable"},
		{"ledger: the guest cannot be listed (unreadable)", LedgerCleanInvariant([]LedgerResult{{Guest: "a", Err: sshDown}}), false, "connection refused"},
		{"ledger: the journal gone beside a lost marker", LedgerCleanInvariant([]LedgerResult{{Guest: "a", Err: journalGone},
			{Guest: "b", Verdict: ledger.Verdict{Guest: "b", Lost: 1, Message: "guest b: LOST 1"}}}), false, "LOST"},
		{"acked intents: none acknowledged (empty)", AckedIntentsKeptInvariant(nil, 100, nil, nil), false, "no intent change acknowledged"},
		{"acked intents: only acks after the cut (empty)", AckedIntentsKeptInvariant([]Ack{{Name: "a", Generation: 1, AtNs: 200}}, 100, nil, nil), false, "no intent change acknowledged"},
		{"acked intents: the rebooted agent lists nothing (missing)", AckedIntentsKeptInvariant([]Ack{{Name: "a", Generation: 1, AtNs: 50}}, 100, nil, nil), false, "does not know it"},
		{"acked intents: the list failed (unreadable)", AckedIntentsKeptInvariant([]Ack{{Name: "a", Generation: 1, AtNs: 50}}, 100, nil, errors.New("connection refused")), false, "could not be listed"},
		{"metrics: no scrape (empty)", MetricExpectationsInvariant(nil, want), false, "only 0 scrape(s)"},
		{"metrics: nothing expected (empty)", MetricExpectationsInvariant(two(map[string]float64{wake: 1}, map[string]float64{wake: 1}), nil), false, "nothing to judge"},
		{"metrics: a series never exported (missing)", MetricExpectationsInvariant(two(map[string]float64{}, map[string]float64{}), want), false, "missing from the last scrape"},
		{"metrics: a misnamed series (missing)", MetricExpectationsInvariant(two(map[string]float64{wake: 1}, map[string]float64{wake: 1}),
			[]MetricWant{{Series: `nodeagent_wake_totl{result="ok"}`, Min: 0, Max: 0}}), false, "never exported"},
		{"metrics: a gauge with no baseline (missing)", MetricExpectationsInvariant(two(map[string]float64{}, map[string]float64{"nodeagent_up": 1}),
			[]MetricWant{{Series: "nodeagent_up", Min: 0, Max: 1}}), false, "no baseline"},
		{"metrics: a series that does not parse (unreadable)", MetricExpectationsInvariant(two(map[string]float64{wake: 1}, map[string]float64{wake: 1}),
			[]MetricWant{{Series: `nodeagent_wake_total{result=`, Min: 0, Max: 0}}), false, "missing from the last scrape"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.inv.OK || tc.inv.HarnessError != tc.harness || !strings.Contains(tc.inv.Evidence, tc.want) {
				t.Fatalf("%+v; want not OK, harness error %v, evidence containing %q", tc.inv, tc.harness, tc.want)
			}
		})
	}

	// and the same invariants pass on positive evidence
	for _, inv := range []reports.Invariant{
		LedgerCleanInvariant([]LedgerResult{{Guest: "a", Verdict: okVerdict}}),
		AckedIntentsKeptInvariant([]Ack{{Name: "a", Delete: true, AtNs: 50}}, 100, nil, nil),
		MetricExpectationsInvariant(two(map[string]float64{wake: 1}, map[string]float64{wake: 1}), want),
		// a labelled counter child first exported during the case starts at 0
		MetricExpectationsInvariant(two(map[string]float64{}, map[string]float64{wake: 2}), []MetricWant{{Series: wake, Min: 1, Max: -1}}),
	} {
		if !inv.OK {
			t.Errorf("%s on positive evidence: %s", inv.Name, inv.Evidence)
		}
	}
}
