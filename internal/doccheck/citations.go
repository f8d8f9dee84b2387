package doccheck

import (
	"fmt"
	"regexp"
	"strings"
)

// citation is "docs/architecture.md §N" or "§N.M" in code; the section must
// exist, or a comment points a reader at nothing.
var citation = regexp.MustCompile(`docs/architecture\.md\s+§(\d+(?:\.\d+)?)`)

// heading is a numbered section of docs/architecture.md: "## 4. vmctl" or
// "### 4.1 Store and locks".
var heading = regexp.MustCompile(`(?m)^#{2,3} (\d+(?:\.\d+)?)\.? `)

// Sections lists the section numbers architecture.md's headings define.
func Sections(arch string) map[string]bool {
	s := map[string]bool{}
	for _, m := range heading.FindAllStringSubmatch(arch, -1) {
		s[m[1]] = true
	}
	return s
}

// BadCitations returns one line per citation in src (a file's text, named
// file) of a section that sections lacks, and per citation of the outside
// design document ("ARCHITECTURE §N"), which the repository no longer keeps.
func BadCitations(file, src string, sections map[string]bool) []string {
	var bad []string
	for i, line := range strings.Split(src, "\n") {
		for _, m := range citation.FindAllStringSubmatch(line, -1) {
			if !sections[m[1]] {
				bad = append(bad, fmt.Sprintf("%s:%d: cites docs/architecture.md §%s, which has no such section", file, i+1, m[1]))
			}
		}
		if strings.Contains(line, "ARCHITECTURE §") {
			bad = append(bad, fmt.Sprintf("%s:%d: cites ARCHITECTURE, the outside design document; cite docs/architecture.md", file, i+1))
		}
	}
	return bad
}
