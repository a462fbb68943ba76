package outbox

// Unexported functions the external tests exercise.
var JSONBTextLen = jsonbTextLen

// Validate runs p's checks of ev without a database.
func Validate(p *Producer, ev Event) error {
	_, err := p.validate(ev, "")
	return err
}

// DeleteOneSQL is ModeInsertDelete's delete after a single insert.
func DeleteOneSQL(p *Producer) string { return p.deleteOne }
