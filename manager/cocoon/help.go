package cocoon

import (
	"regexp"
	"strings"
)

// Help is one `cocoon ... --help` page as cobra prints it: the sub-commands
// under "Available Commands:" and the flags under "Flags:" and "Global
// Flags:". The adapter reads the binary's CLI from these pages only, so it
// fits whatever cocoon release it is given (issue 32 item 4).
type Help struct {
	Commands []string        // sub-command names, in the page's order
	Flags    map[string]Flag // by long name, local and global together
}

// Flag is one line of a Flags section.
type Flag struct {
	Long   string // without the dashes
	Short  string // one letter, "" for none
	Type   string // "string", "int", "stringArray"...; "" for a bool
	Usage  string
	Global bool // listed under "Global Flags:"
}

// flagLine is pflag's FlagUsages line: `  -o, --format string   usage` or
// `      --event           usage` (two or more spaces before the usage).
var flagLine = regexp.MustCompile(`^\s+(?:-([A-Za-z0-9]), )?--([A-Za-z0-9][A-Za-z0-9_-]*)(?: ([A-Za-z0-9]+))?(?:\s{2,}(.*))?$`)

// cmdLine is cobra's `  clone       Clone a new VM from a snapshot`.
var cmdLine = regexp.MustCompile(`^\s+([A-Za-z0-9][A-Za-z0-9_-]*)(?:\s{2,}(.*))?$`)

// ParseHelp reads one help page. Lines it does not know are ignored: a page
// that lists nothing gives an empty Help, and the capability that needed
// the missing entry says so by name.
func ParseHelp(text string) Help {
	h := Help{Flags: map[string]Flag{}}
	section := ""
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimRight(line, " \r")
		if line == "" {
			continue
		}
		if !strings.HasPrefix(line, " ") {
			section = strings.TrimSuffix(line, ":")
			if section == line {
				section = "" // prose, not a heading
			}
			continue
		}
		switch section {
		case "Available Commands", "Additional Commands":
			if m := cmdLine.FindStringSubmatch(line); m != nil {
				h.Commands = append(h.Commands, m[1])
			}
		case "Flags", "Global Flags":
			if m := flagLine.FindStringSubmatch(line); m != nil {
				f := Flag{Short: m[1], Long: m[2], Type: m[3], Usage: m[4], Global: section == "Global Flags"}
				if _, dup := h.Flags[f.Long]; !dup || !f.Global {
					h.Flags[f.Long] = f
				}
			}
		}
	}
	return h
}

// HasCommand reports whether name is a listed sub-command.
func (h Help) HasCommand(name string) bool {
	for _, c := range h.Commands {
		if c == name {
			return true
		}
	}
	return false
}

// JSONFlag is the flag of this page that takes "json" as an output format
// (`-o, --output string  emit "json" ...` on a HEAD lifecycle verb,
// `-o, --format string  output format: "table" or "json"` on a list, `--format
// string  output format: json` on vm status), as argv: its long form, which
// reads plainly in a verb's log. A flag named output that is a file path
// (`snapshot export -o FILE`) does not count: its usage does not say json.
func (h Help) JSONFlag() (string, bool) {
	for _, long := range []string{"output", "format"} {
		f, ok := h.Flags[long]
		if !ok || f.Global || f.Type != "string" || !strings.Contains(strings.ToLower(f.Usage), "json") {
			continue
		}
		return "--" + f.Long, true
	}
	return "", false
}
