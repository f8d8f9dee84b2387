package reports

import (
	"errors"
	"fmt"
	"hash/fnv"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// MaxShards bounds N in "I/N": no CI splits a catalogue further, and a bound
// keeps a hostile results.json from making merge enumerate billions of shards.
const MaxShards = 4096

// ParseShard parses "I/N" (1 ≤ I ≤ N ≤ MaxShards), the form of
// `vmchaos run --shard`.
func ParseShard(s string) (i, n int, err error) {
	a, b, ok := strings.Cut(strings.TrimSpace(s), "/")
	if !ok {
		return 0, 0, fmt.Errorf("shard %q: want I/N, e.g. 1/4", s)
	}
	i, err1 := strconv.Atoi(strings.TrimSpace(a))
	n, err2 := strconv.Atoi(strings.TrimSpace(b))
	if err1 != nil || err2 != nil || n < 1 || i < 1 || i > n || n > MaxShards {
		return 0, 0, fmt.Errorf("shard %q: want I/N with 1 <= I <= N <= %d, e.g. 1/4", s, MaxShards)
	}
	return i, n, nil
}

// Shard returns the ids that belong to shard i of n (1-based, as in "I/N"),
// in their input order. Every distinct id lands in exactly one shard, shard
// sizes differ by at most one, and the split depends only on the set of ids,
// not on their order: ids are ranked by a hash of the id and dealt round-robin
// by rank. Reordering the catalogue therefore moves nothing; adding a case may
// move others, which is fine because all shards of one CI run use one
// catalogue. Out-of-range i or n yields nil.
func Shard(ids []string, i, n int) []string {
	if n < 1 || i < 1 || i > n {
		return nil
	}
	uniq := make([]string, 0, len(ids))
	seen := make(map[string]bool, len(ids))
	for _, id := range ids {
		if !seen[id] {
			seen[id] = true
			uniq = append(uniq, id)
		}
	}
	type ranked struct {
		id string
		h  uint64
	}
	rs := make([]ranked, len(uniq))
	for k, id := range uniq {
		h := fnv.New64a()
		h.Write([]byte(id))
		rs[k] = ranked{id, h.Sum64()}
	}
	sort.Slice(rs, func(a, b int) bool {
		if rs[a].h != rs[b].h {
			return rs[a].h < rs[b].h
		}
		return rs[a].id < rs[b].id
	})
	mine := make(map[string]bool)
	for rank, r := range rs {
		if rank%n == i-1 {
			mine[r.id] = true
		}
	}
	out := make([]string, 0, len(mine))
	for _, id := range uniq {
		if mine[id] {
			out = append(out, id)
		}
	}
	return out
}

// Merge joins shard results into one. Shards must agree on what was tested —
// backend, time scale, seed, label filter and regress switches — or the merge
// is refused: a report mixing them would compare apples with pears. Host,
// supervisor and build may differ between CI runners; they are recorded as a
// sorted, comma-separated list. A case id present in two inputs is refused (the shards
// overlap; within one input an id may repeat, as in a selftest run). Cases
// are ordered by scenario, offset and id. When every input
// carries an "I/N" shard of one N, the shards present and missing are recorded
// (Gate treats missing shards as inconclusive).
func Merge(rs ...*Results) (*Results, error) {
	if err := checkMergeable(rs); err != nil {
		return nil, err
	}
	out := &Results{
		Backend:   rs[0].Backend,
		TimeScale: rs[0].TimeScale,
		Seed:      rs[0].Seed,
		Filter:    rs[0].Filter,
		Regress:   slices.Clone(rs[0].Regress),
		Repeat:    rs[0].Repeat,
		Load:      rs[0].Load,
	}
	if err := mergeRuns(out, rs); err != nil {
		return nil, err
	}
	sort.SliceStable(out.Cases, func(a, b int) bool { return caseLess(&out.Cases[a], &out.Cases[b]) })
	shards, missing, err := shardCoverage(rs)
	if err != nil {
		return nil, err
	}
	out.Shards, out.MissingShards = shards, missing
	// the shards share the matrix: its map over the merged cases
	for _, r := range rs {
		if r.Coverage != nil {
			out.Coverage = r.Coverage.Recompute(out.Cases)
			break
		}
	}
	return out, nil
}

// mergeInputName names an input in a refusal: run id, shard and dir.
func mergeInputName(r *Results) string {
	s := orDefault(r.RunID, "(unnamed)")
	if r.Shard != "" {
		s += " shard " + r.Shard
	}
	if r.Dir != "" {
		s += " (" + r.Dir + ")"
	}
	return s
}

// checkMergeable refuses no inputs, a nil input, and inputs that differ in
// what was tested.
func checkMergeable(rs []*Results) error {
	if len(rs) == 0 {
		return errors.New("merge: no results given")
	}
	for k, r := range rs {
		if r == nil {
			return fmt.Errorf("merge: input #%d is nil", k)
		}
	}
	first := rs[0]
	for _, r := range rs[1:] {
		for _, f := range []struct{ what, a, b string }{
			{"backend", first.Backend, r.Backend},
			{"time scale", fmt.Sprint(first.TimeScale), fmt.Sprint(r.TimeScale)},
			{"seed", fmt.Sprint(first.Seed), fmt.Sprint(r.Seed)},
			{"label filter", first.Filter, r.Filter},
			{"regress switches", strings.Join(sortedCopy(first.Regress), ","), strings.Join(sortedCopy(r.Regress), ",")},
			{"--repeat", fmt.Sprint(first.Repeat), fmt.Sprint(r.Repeat)},
			{"--load", first.Load, r.Load},
		} {
			if f.a != f.b {
				return fmt.Errorf("merge: %s differs: %s has %q, %s has %q; merge only shards of one run configuration",
					f.what, mergeInputName(first), f.a, mergeInputName(r), f.b)
			}
		}
	}
	return nil
}

// mergeRuns joins the inputs' cases, refusing an id held by two inputs, and
// their run ids, hosts, supervisors, builds and start and finish times.
func mergeRuns(out *Results, rs []*Results) error {
	var runIDs, hosts, sups, builds []string
	owner := map[string]int{} // case id → index of the input holding it
	for k, r := range rs {
		runIDs = append(runIDs, r.RunID)
		hosts = append(hosts, r.Host)
		sups = append(sups, r.Supervisor)
		builds = append(builds, r.Build)
		if !r.StartedAt.IsZero() && (out.StartedAt.IsZero() || r.StartedAt.Before(out.StartedAt)) {
			out.StartedAt = r.StartedAt
		}
		if r.FinishedAt.After(out.FinishedAt) {
			out.FinishedAt = r.FinishedAt
		}
		for _, c := range r.Cases {
			if prev, dup := owner[c.ID]; dup && prev != k {
				return fmt.Errorf("merge: case %q is in both %s and %s: shards overlap", c.ID, mergeInputName(rs[prev]), mergeInputName(r))
			}
			owner[c.ID] = k
			out.Cases = append(out.Cases, c)
		}
		out.NotRun = append(out.NotRun, r.NotRun...)
	}
	out.Host = joinUnique(hosts)
	out.Supervisor = joinUnique(sups)
	out.Build = joinUnique(builds)
	if ids := uniqueSorted(runIDs); len(ids) == 1 {
		out.RunID = ids[0]
	} else {
		h := fnv.New64a()
		h.Write([]byte(strings.Join(ids, "\x00")))
		out.RunID = fmt.Sprintf("merged-%016x", h.Sum64())
	}
	return nil
}

// shardCoverage works out which shards of "I/N" were merged and which are
// missing. Inputs without a shard, or with different N, record nothing.
func shardCoverage(rs []*Results) (shards, missing []string, err error) {
	n := 0
	have := map[int]bool{}
	for _, r := range rs {
		var list []string
		if r.Shard != "" {
			list = []string{r.Shard}
		} else {
			list = r.Shards // an already merged input
		}
		if len(list) == 0 {
			return nil, nil, nil
		}
		for _, s := range list {
			i, sn, perr := ParseShard(s)
			if perr != nil {
				return nil, nil, fmt.Errorf("merge: %w", perr)
			}
			if n != 0 && sn != n {
				return nil, nil, nil
			}
			n = sn
			if have[i] {
				return nil, nil, fmt.Errorf("merge: shard %d/%d given twice", i, n)
			}
			have[i] = true
		}
	}
	for i := 1; i <= n; i++ {
		s := fmt.Sprintf("%d/%d", i, n)
		if have[i] {
			shards = append(shards, s)
		} else {
			missing = append(missing, s)
		}
	}
	return shards, missing, nil
}

// caseLess orders cases for merged reports: by scenario, then offset, then id,
// which groups each sweep in offset order.
func caseLess(a, b *Case) bool {
	if a.Scenario != b.Scenario {
		return a.Scenario < b.Scenario
	}
	if a.OffsetMs != b.OffsetMs {
		return a.OffsetMs < b.OffsetMs
	}
	return a.ID < b.ID
}

// RebaseLogs rewrites each case's log paths, relative to fromDir, to be
// relative to toDir, so the links of a merged report written elsewhere still
// reach the shard's files. Absolute paths are left alone.
func RebaseLogs(r *Results, fromDir, toDir string) error {
	fromAbs, err := filepath.Abs(fromDir)
	if err != nil {
		return fmt.Errorf("rebase logs: %w", err)
	}
	toAbs, err := filepath.Abs(toDir)
	if err != nil {
		return fmt.Errorf("rebase logs: %w", err)
	}
	for i := range r.Cases {
		c := &r.Cases[i]
		if len(c.Logs) == 0 {
			continue
		}
		logs := make(map[string]string, len(c.Logs))
		for k, p := range c.Logs {
			if p == "" || filepath.IsAbs(p) {
				logs[k] = p
				continue
			}
			rel, err := filepath.Rel(toAbs, filepath.Join(fromAbs, p))
			if err != nil {
				return fmt.Errorf("rebase log %s of %s: %w", k, c.ID, err)
			}
			logs[k] = rel
		}
		c.Logs = logs
	}
	return nil
}

func sortedCopy(s []string) []string {
	c := slices.Clone(s)
	sort.Strings(c)
	return c
}

func uniqueSorted(s []string) []string {
	c := sortedCopy(s)
	return slices.Compact(c)
}

func joinUnique(s []string) string {
	var keep []string
	for _, v := range uniqueSorted(s) {
		if v != "" {
			keep = append(keep, v)
		}
	}
	return strings.Join(keep, ",")
}
