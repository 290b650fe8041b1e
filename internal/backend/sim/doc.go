// Package sim is a hollow Backend: it runs no VM, only records what it was
// told, so the control plane can be tested at a scale no node could boot.
// An instance is Booting for BootDelay after Start, then Running. Its record
// is StateDir/<id>.json and its console StateDir/<id>.console.log, so a new
// Backend over the same directory re-adopts every instance. Like the real
// guest, the console gets the ready marker KAIRON-READY as its last line once
// the instance is seen Running.
//
//   - sim.go: the Backend, its records and their life;
//   - record_cache.go: records kept in memory while their file is unchanged,
//     so the node's frequent "what runs" does not re-read every file.
package sim
