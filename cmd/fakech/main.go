// Command fakech is the fake cloud-hypervisor of the vmchaos fake backend.
// It is installed as `cloud-hypervisor` too; see docs/fakech.md.
package main

import (
	"os"

	"github.com/vmchaos/vmchaos/fakech"
)

func main() { os.Exit(fakech.Main(os.Args[1:], os.Stdout, os.Stderr)) }
