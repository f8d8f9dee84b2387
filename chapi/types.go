// Package chapi holds the cloud-hypervisor REST API types (the subset vmchaos
// uses; see shared/reference/ch-api-notes.md) and a client for HTTP/1.1 over
// the VMM's unix socket. vmctl, fakech and realch all speak through it.
package chapi

// VM states as reported by vm.info.
const (
	StateCreated  = "Created"
	StateRunning  = "Running"
	StatePaused   = "Paused"
	StateShutdown = "Shutdown"
)

// Endpoint names under /api/v1/.
const (
	EpPing         = "vmm.ping"
	EpShutdownVMM  = "vmm.shutdown"
	EpCreate       = "vm.create"
	EpBoot         = "vm.boot"
	EpShutdown     = "vm.shutdown"
	EpReboot       = "vm.reboot"
	EpPowerButton  = "vm.power-button"
	EpPause        = "vm.pause"
	EpResume       = "vm.resume"
	EpSnapshot     = "vm.snapshot"
	EpRestore      = "vm.restore"
	EpInfo         = "vm.info"
	EpAddNet       = "vm.add-net"
	EpAddDisk      = "vm.add-disk"
	EpRemoveDevice = "vm.remove-device"
	EpDelete       = "vm.delete"
)

// VmmPingResponse is the body of vmm.ping.
type VmmPingResponse struct {
	BuildVersion string   `json:"build_version"`
	Version      string   `json:"version"`
	Pid          int64    `json:"pid"`
	Features     []string `json:"features"`
}

// PayloadConfig is the boot payload.
type PayloadConfig struct {
	Firmware  string `json:"firmware,omitempty"`
	Kernel    string `json:"kernel,omitempty"`
	Cmdline   string `json:"cmdline,omitempty"`
	Initramfs string `json:"initramfs,omitempty"`
}

// CpusConfig is the vCPU config.
type CpusConfig struct {
	BootVcpus int `json:"boot_vcpus"`
	MaxVcpus  int `json:"max_vcpus"`
}

// MemoryConfig is the RAM config; Size in bytes.
type MemoryConfig struct {
	Size      int64 `json:"size"`
	Shared    bool  `json:"shared,omitempty"`
	Hugepages bool  `json:"hugepages,omitempty"`
}

// DiskConfig is one block device.
type DiskConfig struct {
	Path      string `json:"path,omitempty"`
	Readonly  bool   `json:"readonly,omitempty"`
	ImageType string `json:"image_type,omitempty"`
	ID        string `json:"id,omitempty"`
}

// NetConfig is one virtio-net device.
type NetConfig struct {
	Tap       string `json:"tap,omitempty"`
	IP        string `json:"ip,omitempty"`
	Mask      string `json:"mask,omitempty"`
	Mac       string `json:"mac,omitempty"`
	HostMac   string `json:"host_mac,omitempty"`
	Mtu       int    `json:"mtu,omitempty"`
	ID        string `json:"id,omitempty"`
	NumQueues int    `json:"num_queues,omitempty"`
	QueueSize int    `json:"queue_size,omitempty"`
}

// ConsoleConfig is the serial or console config.
type ConsoleConfig struct {
	Mode   string `json:"mode"`
	File   string `json:"file,omitempty"`
	Socket string `json:"socket,omitempty"`
}

// VmConfig is the VM config (subset).
type VmConfig struct {
	Cpus    *CpusConfig    `json:"cpus,omitempty"`
	Memory  *MemoryConfig  `json:"memory,omitempty"`
	Payload *PayloadConfig `json:"payload,omitempty"`
	Disks   []DiskConfig   `json:"disks,omitempty"`
	Net     []NetConfig    `json:"net,omitempty"`
	Serial  *ConsoleConfig `json:"serial,omitempty"`
	Console *ConsoleConfig `json:"console,omitempty"`
}

// DeviceNode is one entry of VmInfo.DeviceTree.
type DeviceNode struct {
	ID       string   `json:"id"`
	Parent   string   `json:"parent,omitempty"`
	Children []string `json:"children"`
	PciBdf   string   `json:"pci_bdf,omitempty"`
}

// VmInfo is the body of vm.info.
type VmInfo struct {
	Config           VmConfig              `json:"config"`
	State            string                `json:"state"`
	MemoryActualSize int64                 `json:"memory_actual_size,omitempty"`
	DeviceTree       map[string]DeviceNode `json:"device_tree,omitempty"`
}

// VmSnapshotConfig is the body of vm.snapshot.
type VmSnapshotConfig struct {
	DestinationURL string `json:"destination_url"`
}

// RestoreConfig is the body of vm.restore.
type RestoreConfig struct {
	SourceURL         string `json:"source_url"`
	Prefault          bool   `json:"prefault,omitempty"`
	MemoryRestoreMode string `json:"memory_restore_mode,omitempty"`
	Resume            bool   `json:"resume,omitempty"`
}

// VmRemoveDevice is the body of vm.remove-device.
type VmRemoveDevice struct {
	ID string `json:"id"`
}

// PciDeviceInfo is the body of a hot-plug answer.
type PciDeviceInfo struct {
	ID  string `json:"id"`
	Bdf string `json:"bdf"`
}
