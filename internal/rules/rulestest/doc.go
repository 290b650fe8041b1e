// Package rulestest builds the in-memory objects (objects.go) that tests of
// the rules and of their callers (scheduler, webhook, kaironctl) feed to
// them.
package rulestest
