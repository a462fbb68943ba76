package amqppub

import (
	"context"
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"
)

// openChannel is a channel in confirm mode with its notifications.
type openChannel struct {
	ch       *amqp.Channel
	confirms chan amqp.Confirmation
	returns  chan amqp.Return
	closed   chan *amqp.Error
	// frameMax is the connection's negotiated frame size: a message's
	// properties (its headers) travel in one frame and must fit it.
	frameMax int
}

// notifyBuffer is the capacity of the confirm and return channels.
// amqp091 blocks its reader on a full one; Publish drains both while it
// waits, so the figure only smooths bursts.
const notifyBuffer = 4096

// channel returns the open channel, opening the connection, the channel
// and the exchange as needed.
func (p *Publisher) channel(ctx context.Context) (*openChannel, error) {
	oc, err := p.open(ctx)
	if err != nil {
		p.lastErr.Store(&err)
	} else {
		p.lastErr.Store(nil)
	}
	return oc, err
}

func (p *Publisher) open(ctx context.Context) (*openChannel, error) {
	if p.ch != nil && !p.ch.ch.IsClosed() {
		return p.ch, nil
	}
	p.ch = nil
	if p.conn == nil || p.conn.IsClosed() {
		if p.conn != nil {
			p.log.Warn("amqp connection lost; reconnecting", "url", redact(p.cfg.URL))
		}
		conn, err := p.dial(ctx)
		if err != nil {
			p.conn = nil
			return nil, err
		}
		p.conn = conn
	}
	ch, err := p.declare()
	if err != nil {
		return nil, err
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, fmt.Errorf("amqppub: cannot put the channel in confirm mode: %w", err)
	}
	oc := &openChannel{
		ch:       ch,
		confirms: ch.NotifyPublish(make(chan amqp.Confirmation, notifyBuffer)),
		returns:  ch.NotifyReturn(make(chan amqp.Return, notifyBuffer)),
		closed:   ch.NotifyClose(make(chan *amqp.Error, 1)),
		frameMax: p.conn.Config.FrameSize,
	}
	p.ch = oc
	return oc, nil
}

// declare opens a channel on which the exchange is known to exist: it
// checks first (which needs no configure permission) and declares the
// exchange, durable and of type topic, only when it is missing.
func (p *Publisher) declare() (*amqp.Channel, error) {
	name := p.cfg.Exchange
	ch, err := p.conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("amqppub: cannot open a channel: %w", err)
	}
	err = ch.ExchangeDeclarePassive(name, amqp.ExchangeTopic, true, false, false, false, nil)
	if err == nil {
		return ch, nil
	}
	var ae *amqp.Error
	if !errors.As(err, &ae) || ae.Code != amqp.NotFound {
		return nil, fmt.Errorf("amqppub: cannot check exchange %q: %w", name, err)
	}
	// The failed check closed the channel.
	if ch, err = p.conn.Channel(); err != nil {
		return nil, fmt.Errorf("amqppub: cannot open a channel: %w", err)
	}
	if err := ch.ExchangeDeclare(name, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		if errors.As(err, &ae) && ae.Code == amqp.AccessRefused {
			return nil, fmt.Errorf("amqppub: exchange %q does not exist and the user may not declare it (%w); declare it (durable, type topic) or grant configure permission", name, err)
		}
		return nil, fmt.Errorf("amqppub: cannot declare exchange %q: %w", name, err)
	}
	p.log.Info("amqp exchange declared", "exchange", name, "type", amqp.ExchangeTopic)
	return ch, nil
}
