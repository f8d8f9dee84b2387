package cocoon

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzParseOutputs: cocoon's list and event outputs are outside input; a
// parser never panics, and never returns a record without an id.
func FuzzParseOutputs(f *testing.F) {
	for _, name := range []string{"vm-list.json", "vm-list-empty.txt", "snapshot-list.json", "snapshot-list-empty.txt", "status-event.jsonl"} {
		b, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{"event":"MODIFIED","vm":{"id":"A","state":"stopped (stale)","config":{"name":"x"}}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		if vms, err := ParseVMs(b); err == nil {
			for _, v := range vms {
				if v.ID == "" {
					t.Fatalf("vm without id from %q", b)
				}
			}
		}
		if ss, err := ParseSnapshots(b); err == nil {
			for _, s := range ss {
				if s.ID == "" {
					t.Fatalf("snapshot without id from %q", b)
				}
			}
		}
		if e, err := ParseEvent(b); err == nil && (e.ID == "" || e.Type == "") {
			t.Fatalf("event without id or type from %q", b)
		}
	})
}

// FuzzParseHelp: a help page is outside input; the parser never panics,
// every flag it returns has a long name that is in the page, and a JSON
// flag it picks is one of the page's flags.
func FuzzParseHelp(f *testing.F) {
	for _, name := range []string{"help/head/vm-run.txt", "help/v02/vm.txt", "help/head/vm-list.txt", "help/v02/root.txt", "help/head/snapshot-export.txt"} {
		b, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(string(b))
	}
	f.Fuzz(func(t *testing.T, text string) {
		h := ParseHelp(text)
		for long, fl := range h.Flags {
			if long == "" || long != fl.Long || !strings.Contains(text, "--"+long) {
				t.Fatalf("flag %q (%+v) not in %q", long, fl, text)
			}
		}
		if jf, ok := h.JSONFlag(); ok {
			if _, in := h.Flags[strings.TrimPrefix(jf, "--")]; !in {
				t.Fatalf("JSON flag %q not among the flags", jf)
			}
		}
	})
}
