package statuspage

// QuoteTable is quoteTable, for tests that write to the table.
var QuoteTable = quoteTable
