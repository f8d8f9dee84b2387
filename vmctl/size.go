package vmctl

import (
	"fmt"
	"strconv"
	"strings"
)

// ParseSize parses a size flag: a number with an optional binary suffix
// K, M, G or T (KiB…TiB; a trailing "i" or "B" is accepted). A bare number
// means MiB, the unit VM memory is usually given in.
func ParseSize(s string) (int64, error) {
	t := strings.ToUpper(strings.TrimSpace(s))
	t = strings.TrimSuffix(strings.TrimSuffix(t, "B"), "I")
	if t == "" {
		return 0, fmt.Errorf("%w: empty size", ErrUsage)
	}
	shift := 20
	switch t[len(t)-1] {
	case 'K':
		shift, t = 10, t[:len(t)-1]
	case 'M':
		shift, t = 20, t[:len(t)-1]
	case 'G':
		shift, t = 30, t[:len(t)-1]
	case 'T':
		shift, t = 40, t[:len(t)-1]
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%w: size %q: want a non-negative number with an optional K/M/G/T suffix", ErrUsage, s)
	}
	if n > (1<<62)>>shift {
		return 0, fmt.Errorf("%w: size %q too large", ErrUsage, s)
	}
	return n << shift, nil
}
