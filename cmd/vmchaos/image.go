package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/vmchaos/vmchaos/fakech/guestimg"
	"golang.org/x/crypto/ssh"
)

func init() { register(newImageCmd) }

func newImageCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "image",
		Short: "Build guest disk images",
		Args:  cobra.NoArgs,
	}
	c.AddCommand(newImageFakeCmd(), newImageRealCmd(), newImageCheckCmd())
	return c
}

func newImageFakeCmd() *cobra.Command {
	var pubkeys []string
	var hostname, out, format string
	var port int
	c := &cobra.Command{
		Use:   "fake --ssh-pubkey FILE -o guest.img",
		Short: "Build a fake guest image for fakech (SSH host key generated, your key authorized)",
		Long: `Builds a fake guest disk image: a small self-describing file that fakech boots as the
guest's disk. It holds a freshly generated SSH host key, the authorized_keys built from
--ssh-pubkey, and the hostname. Clones of a VM copy the image, so they keep the host key.
Like a cloud image, the guest reads a cloud-init NoCloud seed attached as a later disk (vmctl
attaches one to every VM): on the first boot of an instance it takes the seed's host key in
place of the image's and adds the seed's authorized keys.
The guest's sshd listens on every NIC address (ip= of --net / vm.add-net) at --ssh-port,
22 by default as on a real guest (where vmctl dials; binding it needs root).`,
		Example: `  ssh-keygen -t ed25519 -N '' -f key
  vmchaos image fake --ssh-pubkey key.pub -o guest.img
  vmchaos image fake --ssh-pubkey key.pub --hostname web-0 --ssh-port 2200 -o web.img
  vmchaos image fake --ssh-pubkey key.pub --format qcow2 -o base.qcow2`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(pubkeys) == 0 {
				return fmt.Errorf("image fake: --ssh-pubkey is required")
			}
			if out == "" {
				return fmt.Errorf("image fake: -o is required")
			}
			if port <= 0 || port > 65535 {
				return fmt.Errorf("image fake: --ssh-port %d: want 1..65535", port)
			}
			var keys []string
			for _, f := range pubkeys {
				b, err := os.ReadFile(f)
				if err != nil {
					return fmt.Errorf("image fake: %w", err)
				}
				rest := b
				n := 0
				for len(strings.TrimSpace(string(rest))) > 0 {
					k, comment, _, next, err := ssh.ParseAuthorizedKey(rest)
					if err != nil {
						return fmt.Errorf("image fake: %s: not an SSH public key: %w", f, err)
					}
					line := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(k)))
					if comment != "" {
						line += " " + comment
					}
					keys = append(keys, line)
					rest = next
					n++
				}
				if n == 0 {
					return fmt.Errorf("image fake: %s: no SSH public key", f)
				}
			}
			img, err := buildFakeImage(out, format, guestimg.Options{AuthorizedKeys: keys, Hostname: hostname, SSHPort: port})
			if err != nil {
				return fmt.Errorf("image fake: %w", err)
			}
			hk, err := img.HostPublicKey()
			if err != nil {
				return fmt.Errorf("image fake: %w", err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: hostname %s, ssh port %d, host key %s\n", out, img.Hostname, img.SSHPort, ssh.FingerprintSHA256(hk))
			return nil
		},
	}
	c.Flags().StringArrayVar(&pubkeys, "ssh-pubkey", nil, "file with the SSH public key(s) to authorize (repeatable; required)")
	c.Flags().StringVar(&hostname, "hostname", "fake-guest", "guest hostname")
	c.Flags().IntVar(&port, "ssh-port", guestimg.DefaultSSHPort, "port of the guest's SSH server on each NIC address")
	c.Flags().StringVarP(&out, "output", "o", "", "image file to write (required)")
	c.Flags().StringVar(&format, "format", "raw", "raw, or qcow2 (a qcow2 v3 file of 64 MiB virtual size; overlays made with qemu-img create -b on it boot too)")
	return c
}

func buildFakeImage(out, format string, o guestimg.Options) (*guestimg.Image, error) {
	switch format {
	case "raw":
		return guestimg.Build(out, o)
	case "qcow2":
		img, err := guestimg.New(o)
		if err != nil {
			return nil, err
		}
		return img, img.SaveQcow2(out, guestimg.DefaultQcow2Size)
	}
	return nil, fmt.Errorf("--format %q: want raw or qcow2", format)
}
