"""A small realistic shop workload on the demo Postgres: customers and orders, with every kind of change."""

from __future__ import annotations

import random
import sys

import psycopg

SCHEMA = """
create table if not exists public.customers (
    id bigint primary key,
    name text not null,
    email text,
    created_at timestamptz not null default now()
);
create table if not exists public.orders (
    id bigint primary key,
    customer_id bigint not null references public.customers (id),
    amount numeric(12, 2) not null,
    status text not null,
    updated_at timestamptz not null default now()
);
comment on table public.customers is 'Customers of the demo shop.';
comment on column public.customers.id is 'Customer id.';
comment on column public.customers.name is 'Customer name.';
comment on column public.customers.email is 'Customer email.';
comment on column public.customers.created_at is 'When the customer was created.';
comment on table public.orders is 'Orders of the demo shop, one row per order.';
comment on column public.orders.id is 'Order id.';
comment on column public.orders.customer_id is 'The ordering customer''s id.';
comment on column public.orders.amount is 'Order amount.';
comment on column public.orders.status is 'Order status: new, paid, shipped or delivered.';
comment on column public.orders.updated_at is 'Last update time of the order.';
"""
STATUSES = ("new", "paid", "shipped", "delivered")


def main(dsn: str, seed: int = 7, customers: int = 200, orders: int = 1000) -> None:
    """Create the demo tables (if missing) and run one round of inserts, updates and deletes."""
    rnd = random.Random(seed)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SCHEMA)
        base_c = conn.execute("select coalesce(max(id), 0) from public.customers").fetchone()[0]  # type: ignore[index]
        base_o = conn.execute("select coalesce(max(id), 0) from public.orders").fetchone()[0]  # type: ignore[index]
        with conn.transaction():
            conn.cursor().executemany(
                "insert into public.customers (id, name, email) values (%s, %s, %s)",
                [(base_c + i, f"customer {base_c + i}", f"c{base_c + i}@example.com") for i in range(1, customers + 1)],
            )
        for chunk in range(0, orders, 100):
            with conn.transaction():
                conn.cursor().executemany(
                    "insert into public.orders (id, customer_id, amount, status) values (%s, %s, %s, 'new')",
                    [
                        (base_o + chunk + i, base_c + rnd.randint(1, customers), f"{rnd.uniform(5, 500):.2f}")
                        for i in range(1, 101)
                    ],
                )
        for _ in range(orders // 2):  # orders move through their statuses
            oid = base_o + rnd.randint(1, orders)
            with conn.transaction():
                conn.execute(
                    "update public.orders set status = %s, updated_at = now() where id = %s",
                    (rnd.choice(STATUSES[1:]), oid),
                )
        with conn.transaction():  # a few cancellations
            conn.execute(
                "delete from public.orders where id in (select id from public.orders where status = 'new' "
                "order by id limit 20)"
            )
        with conn.transaction():  # two updates of one row in one transaction stay two events
            conn.execute("update public.customers set email = 'first@example.com' where id = %s", (base_c + 1,))
            conn.execute("update public.customers set email = 'second@example.com' where id = %s", (base_c + 1,))


def create_schema(dsn: str) -> None:
    """Create the demo tables if they do not exist."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SCHEMA)


if __name__ == "__main__":
    if sys.argv[1] == "--schema-only":
        create_schema(sys.argv[2])
    else:
        main(sys.argv[1])
