package walrelay

// CreatingMarker is the comment Setup leaves on the publication while it
// creates and checks the slot.
func CreatingMarker(slot string) string { return creatingMarker(slot) }
