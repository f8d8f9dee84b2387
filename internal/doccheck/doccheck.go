// Package doccheck keeps the numbers the docs state honest: a doc that says
// "12 planted bugs" or "55 fast cases" is checked against the code that
// defines them (the regression library, the scenario catalogue, the failpoint
// catalogue, the fault kinds), so a count changed in one place and not the
// other fails the build instead of misleading a reader.
//
// A count is stated in prose by a fixed phrase (docs/architecture.md, "Counts
// the docs state", lists them); the test in this package derives each value
// from the code and runs Check over README.md and docs/*.md.
package doccheck

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// Count is one number the code defines and the docs may state.
type Count struct {
	Name string // what is counted, e.g. "bugs"
	Want int    // the value the code has
	// Phrases find a statement of this count: each has exactly one capture
	// group, the stated number (digits, commas allowed: "1,000").
	Phrases []*regexp.Regexp
}

// Statement is one place a doc states a count.
type Statement struct {
	File   string
	Line   int
	Count  string
	Stated int
	Want   int
	Text   string // the matched phrase
	Number [2]int // byte offsets of the stated number in the doc
}

// Wrong reports whether the statement disagrees with the code.
func (s Statement) Wrong() bool { return s.Stated != s.Want }

func (s Statement) String() string {
	return fmt.Sprintf("%s:%d: %q states %d %s, the code has %d", s.File, s.Line, s.Text, s.Stated, s.Count, s.Want)
}

// Phrase compiles a phrase pattern with one capture group for the number.
// It panics on a pattern without exactly one group: the table is code.
func Phrase(pattern string) *regexp.Regexp {
	re := regexp.MustCompile(pattern)
	if re.NumSubexp() != 1 {
		panic(fmt.Sprintf("doccheck: phrase %q needs exactly one capture group", pattern))
	}
	return re
}

// Find returns every statement of every count in one doc's text, right or
// wrong, in the order of the counts' table. A phrase may run across a line
// break ("12\nplanted bugs"): the text is matched with its newlines read as
// spaces, and the statement carries the line it starts on.
func Find(file, text string, counts []Count) []Statement {
	flat := strings.ReplaceAll(text, "\n", " ") // same length: offsets stay valid
	var out []Statement
	for _, c := range counts {
		for _, re := range c.Phrases {
			for _, m := range re.FindAllStringSubmatchIndex(flat, -1) {
				n, err := strconv.Atoi(strings.ReplaceAll(flat[m[2]:m[3]], ",", ""))
				if err != nil {
					// A statement we cannot read is a wrong one.
					n = -1
				}
				out = append(out, Statement{File: file, Line: strings.Count(text[:m[0]], "\n") + 1,
					Count: c.Name, Stated: n, Want: c.Want, Text: flat[m[0]:m[1]], Number: [2]int{m[2], m[3]}})
			}
		}
	}
	return out
}

// Mismatches returns the statements in text that disagree with the code.
func Mismatches(file, text string, counts []Count) []Statement {
	var out []Statement
	for _, s := range Find(file, text, counts) {
		if s.Wrong() {
			out = append(out, s)
		}
	}
	return out
}
