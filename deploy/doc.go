// Package deploy holds no Go code: it is the operations kit of the outbox
// (Prometheus alerts and their tests, a Grafana dashboard, a systemd unit, a
// Dockerfile), and deploy_test.go checks it against a real relay, consumer
// and Prometheus server.
package deploy
