// Command kaironctl manages Kairon Machines and the objects around them; its
// main.go calls internal/kaironctl's Main. See docs/guides/kaironctl.md.
package main
