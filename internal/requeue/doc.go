// Package requeue holds how the controllers of Kairon's managers queue
// their work and stop taking it: ControllerConfig (queue.go), first-in
// first-out queues for every manager, and UntilStopped (stop.go), a
// reconciler that does nothing once its controller stopped.
package requeue
