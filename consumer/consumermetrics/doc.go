// Package consumermetrics serves a consumer process's Prometheus metrics
// and health: the consumer's counters (New, NewCollector), the group's
// lag per partition read from the brokers (Metrics.WatchLag), and
// /metrics, /healthz and /readyz (Metrics.Handler). It links the consumer
// and Prometheus and nothing of the relay, so a service that only
// consumes stays small.
//
//	m := consumermetrics.New(cfg.Name, cons.Stats)
//	m.WatchLag(cfg.Group, kadm.NewClient(client))
//	go http.ListenAndServe("127.0.0.1:9091", m.Handler(consumermetrics.ReadyCheck{Name: "database", Check: pool.Ping}))
package consumermetrics
