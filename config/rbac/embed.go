package rbac

import "embed"

// Rules holds *.yaml: node-agent, node-agent-register, controller,
// console-reader and guest-user.
//
//go:embed *.yaml
var Rules embed.FS
