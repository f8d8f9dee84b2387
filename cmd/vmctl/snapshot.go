package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
	"github.com/vmchaos/vmchaos/durable"
	"github.com/vmchaos/vmchaos/vmctl"
)

func newSnapshotCmd(g *globals) *cobra.Command {
	c := &cobra.Command{Use: "snapshot", Short: "Manage snapshots"}
	c.AddCommand(newSaveCmd(g), newSnapRmCmd(g), newSnapListCmd(g), newSnapInspectCmd(g), newExportCmd(g), newImportCmd(g))
	return c
}

func newSaveCmd(g *globals) *cobra.Command {
	var name, out string
	c := &cobra.Command{
		Use:   "save [--name N] VM",
		Short: "Snapshot a running VM (pause, capture, resume; pending record, then finalized)",
		Long: `The name preflight sees pending records too: a name held by a pending record is refused
at once with 'snapshot name "<n>" already in use by <ID>', a finalized holder with
'snapshot name "<n>" already exists (held by <ID>)'. Free it with 'vmctl snapshot rm <ID>'.`,
		Example: "  vmctl snapshot save --name web-hib web",
		Args:    cobra.ExactArgs(1),
		RunE: g.run(&out, func(cmd *cobra.Command, args []string, m *vmctl.Manager) error {
			s, err := m.SnapshotSave(cmd.Context(), args[0], name)
			if err != nil {
				return err
			}
			return printRecord(out, s.ID, s)
		}),
	}
	c.Flags().StringVar(&name, "name", "", "snapshot name (default: its id)")
	addOutputFlag(c, &out)
	return c
}

func newSnapRmCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "rm SNAP...",
		Short:   "Delete snapshots by id or name, pending ones included (refused while a lease is held)",
		Example: "  vmctl snapshot rm web-hib\n  vmctl snapshot rm MPT5A6ZS2FNZWQGFN24AZLREWQ",
		Args:    cobra.MinimumNArgs(1),
		RunE: g.run(nil, func(cmd *cobra.Command, args []string, m *vmctl.Manager) error {
			for _, a := range args {
				if err := m.SnapshotRemove(cmd.Context(), a); err != nil {
					return err
				}
				fmt.Println(a)
			}
			return nil
		}),
	}
}

func newSnapListCmd(g *globals) *cobra.Command {
	var out string
	c := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List snapshots (pending ones included)",
		Example: "  vmctl snapshot ls -o json",
		Args:    cobra.NoArgs,
		RunE: g.run(&out, func(cmd *cobra.Command, args []string, m *vmctl.Manager) error {
			ss, err := m.SnapshotList(cmd.Context())
			if err != nil {
				return err
			}
			return printSnaps(os.Stdout, out, ss)
		}),
	}
	addOutputFlag(c, &out)
	return c
}

func newSnapInspectCmd(g *globals) *cobra.Command {
	var out string
	c := &cobra.Command{
		Use:     "inspect SNAP",
		Short:   "Show one snapshot",
		Example: "  vmctl snapshot inspect web-hib -o json",
		Args:    cobra.ExactArgs(1),
		RunE: g.run(&out, func(cmd *cobra.Command, args []string, m *vmctl.Manager) error {
			s, err := m.SnapshotInspect(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if out == "json" {
				return printJSON(os.Stdout, s)
			}
			return printSnaps(os.Stdout, "", []*vmctl.Snapshot{s})
		}),
	}
	addOutputFlag(c, &out)
	return c
}

func newExportCmd(g *globals) *cobra.Command {
	var dest string
	c := &cobra.Command{
		Use:     "export SNAP -o FILE|-",
		Short:   "Write a snapshot as a tar stream (atomic when written to a file)",
		Example: "  vmctl snapshot export web-hib -o /registry/web-hib.tar",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if dest == "" {
				return fmt.Errorf("-o FILE or -o - is required")
			}
			m, err := g.manager()
			if err != nil {
				return err
			}
			if dest == "-" {
				return m.SnapshotExport(cmd.Context(), args[0], os.Stdout)
			}
			return writeAtomically(dest, func(w io.Writer) error { return m.SnapshotExport(cmd.Context(), args[0], w) })
		},
	}
	c.Flags().StringVarP(&dest, "output", "o", "", "destination file, or - for stdout")
	return c
}

// writeAtomically streams into a temp file next to dest, fsyncs it and
// renames it into place, so a reader never sees half an archive.
func writeAtomically(dest string, fill func(io.Writer) error) error {
	f, err := os.CreateTemp(filepath.Dir(dest), "."+filepath.Base(dest)+".tmp-*")
	if err != nil {
		return err
	}
	ok := false
	defer func() {
		if !ok {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if err := fill(f); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(f.Name(), dest); err != nil {
		return err
	}
	ok = true
	return durable.SyncDir(filepath.Dir(dest))
}

func newImportCmd(g *globals) *cobra.Command {
	var name, out string
	c := &cobra.Command{
		Use:     "import [--name N] FILE|-",
		Short:   "Import a snapshot written by export",
		Example: "  vmctl snapshot import --name web-hib /registry/web-hib.tar",
		Args:    cobra.ExactArgs(1),
		RunE: g.run(&out, func(cmd *cobra.Command, args []string, m *vmctl.Manager) error {
			var r io.Reader = os.Stdin
			if args[0] != "-" {
				f, err := os.Open(args[0])
				if err != nil {
					return err
				}
				defer f.Close()
				r = f
			}
			s, err := m.SnapshotImport(cmd.Context(), r, name)
			if err != nil {
				return err
			}
			return printRecord(out, s.ID, s)
		}),
	}
	c.Flags().StringVar(&name, "name", "", "snapshot name (default: the name recorded in the archive)")
	addOutputFlag(c, &out)
	return c
}
