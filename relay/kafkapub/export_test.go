package kafkapub

// Record is the record the Publisher sends for a message, for the tests of
// its shape.
var Record = record
