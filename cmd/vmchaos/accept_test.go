package main

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

func TestAcceptIDsJoinsFlagAndFile(t *testing.T) {
	f := filepath.Join(t.TempDir(), "accept")
	if err := os.WriteFile(f, []byte("# cocoon findings\nmgr-a\n\n mgr-b  # clone\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := acceptIDs([]string{"mgr-c", " "}, f)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"mgr-a": true, "mgr-b": true, "mgr-c": true}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	if _, err := acceptIDs(nil, filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Fatal("a missing accept file must be an error")
	}
	if got, err := acceptIDs(nil, ""); err != nil || got != nil {
		t.Fatalf("no accept: %v %v", got, err)
	}
}
