// Package packaging holds the systemd units vmchaos ships (nodeagent.service,
// vmctl-daemon.service). It has no code: its test boots each unit file, as
// shipped apart from paths, under a real systemd (the injector's private
// sandbox) and checks the settings the chaos scenarios rely on.
package packaging
