{{ typed_current_state(var('changelake_demo_source'), 'public', 'customers') }}
