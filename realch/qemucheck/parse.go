package qemucheck

import (
	"regexp"
	"strings"
)

// Parsers of what the guest prints; pure, so that each check's failure
// cases are tested without a guest.

var ansiRE = regexp.MustCompile(`\x1b\[[0-9;]*[A-Za-z]`)

// plain drops the terminal escapes systemd colours the console with.
func plain(s string) string { return strings.TrimSpace(ansiRE.ReplaceAllString(s, "")) }

// parseKV reads "key=value" lines (the guest's report script).
func parseKV(s string) map[string]string {
	m := map[string]string{}
	for _, ln := range strings.Split(s, "\n") {
		if k, v, ok := strings.Cut(ln, "="); ok {
			m[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	return m
}

// lease is the last lease of a dhclient.leases file.
type lease struct {
	Interface string
	Address   string // fixed-address
	Server    string // option dhcp-server-identifier
	Router    string // option routers
	Seconds   string // option dhcp-lease-time
}

// parseLeases returns the last lease block of dhclient's lease database
// (dhclient appends; the last is the current one), ok false when none.
func parseLeases(s string) (lease, bool) {
	var cur, last lease
	in, found := false, false
	for _, ln := range strings.Split(s, "\n") {
		ln = strings.TrimSpace(ln)
		switch {
		case strings.HasPrefix(ln, "lease {"):
			cur, in = lease{}, true
		case ln == "}" && in:
			last, found, in = cur, true, false
		case in:
			f := strings.Fields(strings.TrimSuffix(ln, ";"))
			if len(f) < 2 {
				continue
			}
			v := strings.Trim(f[len(f)-1], `"`)
			switch {
			case f[0] == "interface":
				cur.Interface = v
			case f[0] == "fixed-address":
				cur.Address = v
			case f[0] == "option" && f[1] == "dhcp-server-identifier":
				cur.Server = v
			case f[0] == "option" && f[1] == "routers":
				cur.Router = v
			case f[0] == "option" && f[1] == "dhcp-lease-time":
				cur.Seconds = v
			}
		}
	}
	return last, found
}

// addrLine is `ip -4 -o addr show dev eth0` reduced to what the checks
// read: the CIDR and whether the address expires (a DHCP lease) or is
// permanent (static).
type addrLine struct {
	CIDR    string
	Forever bool
}

// parseAddr finds cidr in `ip -4 -o addr` output.
func parseAddr(s, cidr string) (addrLine, bool) {
	for _, ln := range strings.Split(s, "\n") {
		f := strings.Fields(ln)
		for i := 0; i+1 < len(f); i++ {
			if f[i] == "inet" && f[i+1] == cidr {
				return addrLine{CIDR: cidr, Forever: strings.Contains(ln, "valid_lft forever")}, true
			}
		}
	}
	return addrLine{}, false
}
