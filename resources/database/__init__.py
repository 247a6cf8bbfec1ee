"""rota's database: the embedded server, engines and their refusals, the migrations'
runner, the tables, and what a tenant may do."""
