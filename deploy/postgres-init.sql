-- What a DBA runs once, as a superuser (the compose file's PostgreSQL runs it at first
-- start). The passwords are the compose file's examples: change them.
CREATE ROLE rota_owner LOGIN BYPASSRLS PASSWORD 'rota-owner-example';
CREATE ROLE rota_app LOGIN PASSWORD 'rota-app-example';
CREATE DATABASE rota OWNER rota_owner;
CREATE DATABASE rota_dagster OWNER rota_owner;
