package main

import "github.com/vmchaos/vmchaos/realch"

// The KVM part of `vmchaos doctor` comes from realch's preflight, so doctor
// and the real-backend specs skip for the same, precise reason.
func init() { kvmPreflight = realch.KVMSkipReason }
