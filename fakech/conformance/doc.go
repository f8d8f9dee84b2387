// Package conformance holds the fakech ⇄ cloud-hypervisor conformance suite
// (docs/fakech.md "Conformance with cloud-hypervisor"; issue 35 item 3). The
// package has no code of its own: its tests run every row of the table
// against the real fakech binary always, and against a real cloud-hypervisor
// binary when VMCHAOS_CH names one. A row that needs a booted guest or a
// snapshot is skipped on the real binary with the preflight's reason
// (realch.PreflightKVM, realch.SnapshotBlock), never counted as passed.
//
//	go test ./fakech/conformance/                       # fakech only
//	VMCHAOS_CH=/path/to/cloud-hypervisor make conformance
package conformance
