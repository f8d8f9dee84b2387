package doccheck

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCodeCitesArchitectureSectionsThatExist walks every Go file of the
// module: each "docs/architecture.md §N" must name a section the doc has, and
// at least one must exist (the code cites the doc, issue 30).
func TestCodeCitesArchitectureSectionsThatExist(t *testing.T) {
	arch, err := os.ReadFile(filepath.Join(root, "docs", "architecture.md"))
	if err != nil {
		t.Fatalf("read docs/architecture.md: %v", err)
	}
	sections := Sections(string(arch))
	if len(sections) < 10 {
		t.Fatalf("docs/architecture.md: %d numbered sections found, want the §0–§15 of the contracts", len(sections))
	}
	cites := 0
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && p != root || d.Name() == "vmchaos-results" || d.Name() == "bin") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasPrefix(filepath.Base(p), "citations") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		cites += len(citation.FindAllString(string(b), -1))
		for _, bad := range BadCitations(p, string(b), sections) {
			t.Error(bad)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if cites == 0 {
		t.Fatal("no Go file cites docs/architecture.md: the contracts and the code have come apart")
	}
	t.Logf("%d citations of docs/architecture.md, every one to a section it has", cites)
}

// TestBadCitationsAreNamed proves the check can fail: a missing section and
// the outside document are both reported, an existing section is not.
func TestBadCitationsAreNamed(t *testing.T) {
	sections := Sections("## 3. failpoint\n### 4.1 Store and locks\n")
	src := "// ok (docs/architecture.md §3)\n// ok docs/architecture.md §4.1\n// bad docs/architecture.md §99\n// old (ARCHITECTURE §3)\n"
	got := BadCitations("x.go", src, sections)
	if len(got) != 2 || !strings.Contains(got[0], "x.go:3") || !strings.Contains(got[0], "§99") || !strings.Contains(got[1], "x.go:4") {
		t.Fatalf("bad citations: %q, want x.go:3 (§99) and x.go:4 (ARCHITECTURE)", got)
	}
}
