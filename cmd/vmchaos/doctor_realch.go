package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/vmchaos/vmchaos/injector"
	"github.com/vmchaos/vmchaos/realch"
)

// The KVM part of `vmchaos doctor` comes from realch's preflight, so doctor
// and the real-backend specs skip for the same, precise reason.
func init() {
	kvmPreflight = realch.KVMSkipReason
	chPreflight = realCHCheck
}

// chPreflight, when set, replaces the PATH-only "ch" check with realch's
// discovery: binary and version, boot payload and guest image.
var chPreflight func(ctx context.Context, bin string) injector.Check

// realCHCheck says `ch ok` only when everything the real backend boots is
// there, and otherwise names each missing item with where it looked.
func realCHCheck(_ context.Context, bin string) injector.Check {
	var o realch.Options
	if bin != realch.CHName {
		o.CHBinary = bin // --ch-binary given; the default leaves discovery its order
	}
	env, err := realch.Discover(o)
	var missing *realch.MissingError
	switch {
	case errors.As(err, &missing):
		items := missing.Items
		for i, it := range items {
			if strings.HasPrefix(it, "guest disk image") || strings.HasPrefix(it, "boot payload") {
				items[i] = it + " — `vmchaos image real` builds both"
			}
		}
		return injector.Check{Name: "ch", OK: false, Detail: "real backend: " + strings.Join(items, "; ") + " (only fakech runs)"}
	case err != nil:
		return injector.Check{Name: "ch", OK: false, Detail: err.Error()}
	}
	payload := "firmware " + env.Firmware
	if env.Kernel != "" {
		payload = "kernel " + env.Kernel
		if env.Initramfs != "" {
			payload += " + " + env.Initramfs
		}
	}
	return injector.Check{Name: "ch", OK: true, Detail: fmt.Sprintf("cloud-hypervisor %s (%s), %s, image %s", env.CHVersion, env.CHBinary, payload, env.Image)}
}
