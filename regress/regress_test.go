package regress

import (
	"strings"
	"testing"
)

func TestParseRejectsUnknownBug(t *testing.T) {
	if _, err := Parse("failed-sticky, no-such-bug"); err == nil || !strings.Contains(err.Error(), "no-such-bug") {
		t.Fatalf("Parse accepted an unknown bug: %v", err)
	}
	got, err := Parse(" failed-sticky ,,save-rm-by-name")
	if err != nil || len(got) != 2 || got[0] != "failed-sticky" || got[1] != "save-rm-by-name" {
		t.Fatalf("Parse = %v, %v", got, err)
	}
}

func TestOnPanicsOnATypo(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("On accepted an unknown switch name")
		}
	}()
	On("failed-stiky")
}

func TestEveryBugIsDescribed(t *testing.T) {
	seen := map[string]bool{}
	for _, b := range Bugs {
		if seen[b.Name] {
			t.Errorf("bug %s listed twice", b.Name)
		}
		seen[b.Name] = true
		if b.Seed == "" || b.What == "" || b.Invariant == "" || (b.Component != "vmctl" && b.Component != "nodeagent" && b.Component != "controlplane") {
			t.Errorf("bug %s: incomplete entry %+v", b.Name, b)
		}
	}
}
