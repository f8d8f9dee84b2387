package fakech

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/vmchaos/vmchaos/timescale"
)

// The guest shell: enough of sh for the ledger and the agent. A command line
// is simple commands joined by `&&`, `||` or `;`; each may redirect its
// stdout with `> file` or `>> file`. Words may be quoted with '...' or "..."
// and characters escaped with a backslash.

type token struct {
	op   string // "", "&&", "||", ";", ">", ">>", "|"
	word string
}

// tokenize splits a command line into words and operators.
func tokenize(line string) ([]token, error) {
	var out []token
	var cur strings.Builder
	inWord := false
	flush := func() {
		if inWord {
			out = append(out, token{word: cur.String()})
			cur.Reset()
			inWord = false
		}
	}
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n':
			flush()
		case c == '\'':
			j := strings.IndexByte(line[i+1:], '\'')
			if j < 0 {
				return nil, fmt.Errorf("unterminated quoted string")
			}
			cur.WriteString(line[i+1 : i+1+j])
			inWord = true
			i += j + 1
		case c == '"':
			i++
			for ; i < len(line) && line[i] != '"'; i++ {
				if line[i] == '\\' && i+1 < len(line) && strings.IndexByte(`"\$`+"`", line[i+1]) >= 0 {
					i++
				}
				cur.WriteByte(line[i])
			}
			if i >= len(line) {
				return nil, fmt.Errorf("unterminated quoted string")
			}
			inWord = true
		case c == '\\':
			if i+1 < len(line) {
				i++
				cur.WriteByte(line[i])
				inWord = true
			}
		case c == ';':
			flush()
			out = append(out, token{op: ";"})
		case c == '&':
			flush()
			if i+1 < len(line) && line[i+1] == '&' {
				out = append(out, token{op: "&&"})
				i++
			} else {
				return nil, fmt.Errorf("background jobs (&) are not supported")
			}
		case c == '|':
			flush()
			if i+1 < len(line) && line[i+1] == '|' {
				out = append(out, token{op: "||"})
				i++
			} else {
				out = append(out, token{op: "|"})
			}
		case c == '>':
			flush()
			if i+1 < len(line) && line[i+1] == '>' {
				out = append(out, token{op: ">>"})
				i++
			} else {
				out = append(out, token{op: ">"})
			}
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	flush()
	return out, nil
}

type simpleCmd struct {
	argv     []string
	redirect string // "" or the file stdout goes to
	appendTo bool
	join     string // operator before this command: "", "&&", "||", ";"
}

// parseLine builds the command list from tokens.
func parseLine(line string) ([]simpleCmd, error) {
	toks, err := tokenize(line)
	if err != nil {
		return nil, err
	}
	var cmds []simpleCmd
	cur := simpleCmd{}
	for i := 0; i < len(toks); i++ {
		t := toks[i]
		switch t.op {
		case "":
			cur.argv = append(cur.argv, t.word)
		case ">", ">>":
			if i+1 >= len(toks) || toks[i+1].op != "" {
				return nil, fmt.Errorf("syntax error: redirection without a file")
			}
			i++
			cur.redirect, cur.appendTo = toks[i].word, t.op == ">>"
		case "|":
			return nil, fmt.Errorf("pipes are not supported by the fake guest shell")
		default:
			if len(cur.argv) == 0 {
				if t.op == ";" && len(cmds) == 0 && cur.join == "" {
					continue
				}
				return nil, fmt.Errorf("syntax error near unexpected token `%s'", t.op)
			}
			cmds = append(cmds, cur)
			cur = simpleCmd{join: t.op}
		}
	}
	if len(cur.argv) > 0 {
		cmds = append(cmds, cur)
	} else if cur.join == "&&" || cur.join == "||" {
		return nil, fmt.Errorf("syntax error: unexpected end of command")
	} else if cur.redirect != "" {
		return nil, fmt.Errorf("syntax error: redirection without a command")
	}
	return cmds, nil
}

// run executes a command line in the guest and returns its exit status.
func (g *guest) run(ctx context.Context, line string, stdout, stderr io.Writer) int {
	cmds, err := parseLine(line)
	if err != nil {
		fmt.Fprintf(stderr, "sh: 1: %v\n", err)
		return 2
	}
	status := 0
	for i, c := range cmds {
		if i > 0 && (c.join == "&&" && status != 0 || c.join == "||" && status == 0) {
			continue
		}
		status = g.exec(ctx, c, stdout, stderr)
	}
	return status
}

func (g *guest) exec(ctx context.Context, c simpleCmd, stdout, stderr io.Writer) int {
	if c.argv[0] == WriterCmd && c.redirect == "" {
		// the workload writer takes the guest lock per marker, not for its life
		return g.writer(ctx, c.argv[1:], stdout, stderr)
	}
	if c.argv[0] == "sleep" {
		// sleep runs without the guest lock so other sessions go on.
		if err := g.wait(ctx); err != nil {
			return 255
		}
		return g.sleep(ctx, c.argv[1:], stderr)
	}
	if err := g.lockRunning(ctx); err != nil {
		return 255
	}
	defer g.mu.Unlock()
	out := stdout
	var buf bytes.Buffer
	if c.redirect != "" {
		out = &buf
	}
	status := g.builtin(c.argv, out, stderr)
	if c.redirect != "" {
		p := guestPath(c.redirect)
		if !g.isDir(parentDir(p)) || g.isDir(p) || p == BootIDPath {
			fmt.Fprintf(stderr, "sh: 1: cannot create %s: %s\n", c.redirect, map[bool]string{true: "Is a directory", false: "Directory nonexistent"}[g.isDir(p)])
			return 2
		}
		t := g.treeFor(p)
		if c.appendTo {
			t.Files[p] = append(bytes.Clone(t.Files[p]), buf.Bytes()...)
		} else {
			t.Files[p] = bytes.Clone(buf.Bytes())
		}
	}
	return status
}

func parentDir(p string) string {
	i := strings.LastIndexByte(p, '/')
	if i <= 0 {
		return "/"
	}
	return p[:i]
}

func (g *guest) sleep(ctx context.Context, args []string, stderr io.Writer) int {
	if len(args) != 1 {
		fmt.Fprintln(stderr, "sleep: missing operand")
		return 1
	}
	secs, err := strconv.ParseFloat(args[0], 64)
	if err != nil || secs < 0 {
		fmt.Fprintf(stderr, "sleep: invalid time interval '%s'\n", args[0])
		return 1
	}
	// Guest time runs at the harness's scale like every other duration.
	if timescale.Sleep(ctx, time.Duration(secs*float64(time.Second))) != nil {
		return 130
	}
	return 0
}

// flagsAndArgs separates leading -x options from operands.
func flagsAndArgs(argv []string) (map[byte]bool, []string) {
	fl := map[byte]bool{}
	i := 0
	for ; i < len(argv); i++ {
		a := argv[i]
		if a == "--" {
			i++
			break
		}
		if len(a) < 2 || a[0] != '-' {
			break
		}
		for j := 1; j < len(a); j++ {
			fl[a[j]] = true
		}
	}
	return fl, argv[i:]
}

// builtin runs one command with g.mu held.
func (g *guest) builtin(argv []string, stdout, stderr io.Writer) int {
	name, args := argv[0], argv[1:]
	switch name {
	case "true", ":":
		return 0
	case "false":
		return 1
	case "hostname":
		h := strings.TrimSpace(string(g.disk.Files["/etc/hostname"]))
		if h == "" && g.base != nil {
			h = g.base.Hostname
		}
		if h == "" {
			h = "localhost"
		}
		fmt.Fprintln(stdout, h)
		return 0
	case "echo":
		nl := true
		if len(args) > 0 && args[0] == "-n" {
			nl, args = false, args[1:]
		}
		io.WriteString(stdout, strings.Join(args, " "))
		if nl {
			io.WriteString(stdout, "\n")
		}
		return 0
	case "sync":
		if err := g.syncLocked(); err != nil {
			fmt.Fprintf(stderr, "sync: %v\n", err)
			return 1
		}
		return 0
	case "dhclient":
		if len(args) == 1 && args[0] == "-r" {
			g.dhcp = true
			return 0
		}
		fmt.Fprintln(stderr, "dhclient: only `dhclient -r` is modelled by the fake guest")
		return 1
	case "touch":
		return g.touch(args, stderr)
	case "cat":
		return g.cat(args, stdout, stderr)
	case "ls":
		return g.ls(args, stdout, stderr)
	case "rm":
		return g.rm(args, stderr)
	case "mkdir":
		return g.mkdir(args, stderr)
	case "sha256sum":
		return g.sha256sum(args, stdout, stderr)
	}
	fmt.Fprintf(stderr, "sh: 1: %s: not found\n", name)
	return 127
}

func (g *guest) touch(args []string, stderr io.Writer) int {
	_, files := flagsAndArgs(args)
	if len(files) == 0 {
		fmt.Fprintln(stderr, "touch: missing file operand")
		return 1
	}
	status := 0
	for _, f := range files {
		p := guestPath(f)
		switch {
		case g.isDir(p):
		case p == BootIDPath || strings.HasPrefix(p, "/proc/") || !g.isDir(parentDir(p)):
			fmt.Fprintf(stderr, "touch: cannot touch '%s': No such file or directory\n", f)
			status = 1
		default:
			t := g.treeFor(p)
			if _, ok := t.Files[p]; !ok {
				t.Files[p] = []byte{}
			}
		}
	}
	return status
}

func (g *guest) cat(args []string, stdout, stderr io.Writer) int {
	_, files := flagsAndArgs(args)
	status := 0
	for _, f := range files {
		p := guestPath(f)
		if b, ok := g.readFile(p); ok {
			stdout.Write(b)
			continue
		}
		if g.isDir(p) {
			fmt.Fprintf(stderr, "cat: %s: Is a directory\n", f)
		} else {
			fmt.Fprintf(stderr, "cat: %s: No such file or directory\n", f)
		}
		status = 1
	}
	return status
}

func (g *guest) ls(args []string, stdout, stderr io.Writer) int {
	fl, ops := flagsAndArgs(args)
	for f := range fl {
		if f != '1' && f != 'a' && f != 'A' {
			fmt.Fprintf(stderr, "ls: invalid option -- '%c'\n", f)
			return 2
		}
	}
	if len(ops) == 0 {
		ops = []string{"."}
	}
	status := 0
	for i, o := range ops {
		p := guestPath(o)
		if _, ok := g.readFile(p); ok {
			fmt.Fprintln(stdout, o)
			continue
		}
		if !g.isDir(p) {
			fmt.Fprintf(stderr, "ls: cannot access '%s': No such file or directory\n", o)
			status = 2
			continue
		}
		if len(ops) > 1 {
			if i > 0 {
				fmt.Fprintln(stdout)
			}
			fmt.Fprintf(stdout, "%s:\n", o)
		}
		for _, n := range g.list(p) {
			if strings.HasPrefix(n, ".") && !fl['a'] && !fl['A'] {
				continue
			}
			fmt.Fprintln(stdout, n)
		}
	}
	return status
}

func (g *guest) rm(args []string, stderr io.Writer) int {
	fl, ops := flagsAndArgs(args)
	force, recursive := fl['f'], fl['r'] || fl['R']
	if len(ops) == 0 && !force {
		fmt.Fprintln(stderr, "rm: missing operand")
		return 1
	}
	status := 0
	for _, o := range ops {
		p := guestPath(o)
		t := g.treeFor(p)
		if _, ok := t.Files[p]; ok {
			delete(t.Files, p)
			continue
		}
		if g.isDir(p) {
			if !recursive {
				fmt.Fprintf(stderr, "rm: cannot remove '%s': Is a directory\n", o)
				status = 1
				continue
			}
			pre := p + "/"
			for k := range t.Files {
				if strings.HasPrefix(k, pre) {
					delete(t.Files, k)
				}
			}
			for k := range t.Dirs {
				if k == p || strings.HasPrefix(k, pre) {
					delete(t.Dirs, k)
				}
			}
			continue
		}
		if !force {
			fmt.Fprintf(stderr, "rm: cannot remove '%s': No such file or directory\n", o)
			status = 1
		}
	}
	return status
}

func (g *guest) mkdir(args []string, stderr io.Writer) int {
	fl, ops := flagsAndArgs(args)
	if len(ops) == 0 {
		fmt.Fprintln(stderr, "mkdir: missing operand")
		return 1
	}
	status := 0
	for _, o := range ops {
		p := guestPath(o)
		if _, isFile := g.readFile(p); isFile || strings.HasPrefix(p, "/proc/") {
			fmt.Fprintf(stderr, "mkdir: cannot create directory '%s': File exists\n", o)
			status = 1
			continue
		}
		if g.isDir(p) {
			if !fl['p'] {
				fmt.Fprintf(stderr, "mkdir: cannot create directory '%s': File exists\n", o)
				status = 1
			}
			continue
		}
		if !fl['p'] && !g.isDir(parentDir(p)) {
			fmt.Fprintf(stderr, "mkdir: cannot create directory '%s': No such file or directory\n", o)
			status = 1
			continue
		}
		// -p: every missing ancestor is created too; a file in the way fails.
		var chain []string
		for d := p; !g.isDir(d); d = parentDir(d) {
			if _, isFile := g.readFile(d); isFile {
				fmt.Fprintf(stderr, "mkdir: cannot create directory '%s': Not a directory\n", o)
				status = 1
				chain = nil
				break
			}
			chain = append(chain, d)
		}
		for _, d := range chain {
			g.treeFor(d).Dirs[d] = true
		}
	}
	return status
}

func (g *guest) sha256sum(args []string, stdout, stderr io.Writer) int {
	_, files := flagsAndArgs(args)
	status := 0
	for _, f := range files {
		b, ok := g.readFile(guestPath(f))
		if !ok {
			fmt.Fprintf(stderr, "sha256sum: %s: No such file or directory\n", f)
			status = 1
			continue
		}
		sum := sha256.Sum256(b)
		fmt.Fprintf(stdout, "%s  %s\n", hex.EncodeToString(sum[:]), f)
	}
	return status
}
